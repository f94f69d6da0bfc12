"""Running observation normalisation and reward scaling (both optional, off by default).

`RunningMeanStd` keeps the exact mean and (population) variance of every
sample it has seen, per feature, in float64: each batch is merged with the
parallel-variance formula of Chan et al., so after any sequence of batches
`mean` and `var` equal NumPy's `mean` / `var` over all of them concatenated
(up to float64 rounding).

`ObservationNormalizer` (train.normalize_obs): the policy sees
clip((obs - mean) / sqrt(var + eps), -clip, clip), per feature. The statistics
are updated from every observation the env returns during rollouts (the
live rows only, when the env has agent masks), before that observation is
fed to the policy. The env's buffer is only read: the result is written
into a tensor the trainer owns (the rollout storage row).

`RewardScaler` (train.normalize_reward): the reward each row gets is divided
by the running standard deviation of its discounted return
(ret <- gamma * ret + r, reset at episode ends) and clipped, which is the
usual VecNormalize practice: the reward's scale becomes ~1 whatever the env,
without shifting its mean (a shift would change which behaviour is optimal
near terminals).

One implementation serves both env paths: the statistics are float64 torch
tensors on the device their data lives on (the host for a NumPy env batch,
the trainer's device for a device batch), and every update is a handful of
tensor ops with no host read. Live rows are selected with masked sums (a
weight of 0 for dead rows), not boolean indexing, and the sample count is a
float64 tensor (exact up to 2**53 samples) beside the statistics, so a device
batch's rollout never waits for the device. Only `state_dict` reads them back
(at an update boundary): float64 CPU tensors and an integer count, whichever
device they were on, so a resumed run continues bit for bit and a checkpoint
does not depend on the path that wrote it.
"""
from __future__ import annotations

import torch

EPSILON = 1e-8


def _float64_cpu(value, shape: tuple, label: str) -> torch.Tensor:
    """A checkpoint entry (tensor or array-like) as a float64 CPU tensor of `shape`."""
    tensor = torch.as_tensor(value, dtype=torch.float64, device="cpu")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{label} statistics have shape {tuple(tensor.shape)}, expected {shape}")
    return tensor


class RunningMeanStd:
    """Exact running mean and population variance per feature (float64 tensors on
    `device`; `count` is a float64 tensor there too)."""

    def __init__(self, shape=(), device="cpu"):
        self.shape = tuple(shape)
        self.device = torch.device(device)
        self.mean = torch.zeros(self.shape, dtype=torch.float64, device=self.device)
        self.var = torch.ones(self.shape, dtype=torch.float64, device=self.device)
        self.count = torch.zeros((), dtype=torch.float64, device=self.device)

    def update(self, batch, live=None) -> None:
        """Merges a batch of samples (first axis = samples; NumPy or torch). `live`
        (optional, bool per sample) keeps only its True rows: their sums are taken
        with the others zeroed and their number is `live.sum()`, so the device is
        never asked how many there are."""
        batch = torch.as_tensor(batch).to(self.device, torch.float64)
        if live is None:
            n = divisor = batch.shape[0]
            if n == 0:
                return
            batch_mean = batch.sum(0) / divisor
            deviation = batch - batch_mean
        else:
            keep = torch.as_tensor(live).to(self.device, torch.bool)
            keep = keep.reshape(-1, *(1,) * (batch.dim() - 1))
            n = keep.sum(dtype=torch.float64)
            divisor = n.clamp(min=1)            # an all-dead batch: 0 / 1, then discarded
            # where(), not a product with the mask: a dead row's NaN or inf cannot leak.
            batch_mean = torch.where(keep, batch, 0.0).sum(0) / divisor
            deviation = torch.where(keep, batch - batch_mean, 0.0)
        self._merge(batch_mean, (deviation * deviation).sum(0) / divisor, n)

    def _merge(self, batch_mean, batch_var, n) -> None:
        """Chan et al.'s merge of (mean, var, count) with a batch's; `n` is an int or,
        for a masked batch, a float64 tensor that may be 0."""
        count = self.count
        total = count + n
        delta = batch_mean - self.mean
        mean = self.mean + delta * (n / total)
        m2 = self.var * count + batch_var * n + delta * delta * (count * n / total)
        # The first batch is taken as it is (the prior var of 1 is no sample).
        first = count == 0
        mean = torch.where(first, batch_mean, mean)
        var = torch.where(first, batch_var, m2 / total)
        if isinstance(n, torch.Tensor):         # an all-dead batch changes nothing
            empty = n == 0
            mean = torch.where(empty, self.mean, mean)
            var = torch.where(empty, self.var, var)
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(total)

    def state_dict(self) -> dict:
        return {"mean": self.mean.to("cpu", copy=True), "var": self.var.to("cpu", copy=True),
                "count": int(self.count)}

    def load_state_dict(self, state: dict, label: str = "normaliser") -> None:
        mean = _float64_cpu(state["mean"], self.shape, label)
        var = _float64_cpu(state["var"], self.shape, label)
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.fill_(int(state["count"]))


class ObservationNormalizer:
    """clip((obs - mean) / sqrt(var + eps)) per feature, into a caller's tensor.

    `device`: where the float32 shift/scale (the policy input's side) live;
    `stats_device` (default `device`): where the statistics are updated, i.e.
    where the env's observations are (the host for a NumPy batch)."""

    def __init__(self, obs_dim: int, clip: float = 10.0, device="cpu", stats_device=None):
        self.device = torch.device(device)
        self.stats = RunningMeanStd((obs_dim,), self.device if stats_device is None
                                    else stats_device)
        self.clip = float(clip)
        self.shift = torch.zeros(obs_dim, dtype=torch.float32, device=self.device)
        self.scale = torch.ones(obs_dim, dtype=torch.float32, device=self.device)
        self._refresh()

    def _refresh(self) -> None:
        """The float32 shift/scale the policy input uses, refreshed in place (every
        step), from the float64 statistics (rounded once, at the end)."""
        self.shift.copy_(self.stats.mean)
        self.scale.copy_(1.0 / torch.sqrt(self.stats.var + EPSILON))

    def update(self, observations, live=None) -> None:
        """Adds the env's observations (only read) to the statistics; `live` as in
        RunningMeanStd.update."""
        self.stats.update(observations, live)
        self._refresh()

    def normalize(self, observations: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Normalised float32 copy of `observations` (written into `out` when given)."""
        x = observations if observations.dtype == torch.float32 else observations.float()
        out = torch.sub(x, self.shift, out=out) if out is not None else x - self.shift
        out.mul_(self.scale)
        return out.clamp_(-self.clip, self.clip)

    def state_dict(self) -> dict:
        return {**self.stats.state_dict(), "clip": self.clip}

    def load_state_dict(self, state: dict, label: str = "observation normaliser") -> None:
        self.stats.load_state_dict(state, label)
        self.clip = float(state.get("clip", self.clip))
        self._refresh()


class RewardScaler:
    """Rewards divided by the running std of each row's discounted return, clipped.
    The returns and statistics live on `device`, where the env's rewards are."""

    def __init__(self, rows: int, gamma: float, clip: float = 10.0, device="cpu"):
        self.stats = RunningMeanStd((), device)
        self.returns = torch.zeros(rows, dtype=torch.float64, device=self.stats.device)
        self.gamma = float(gamma)
        self.clip = float(clip)

    def scale(self, rewards, dones, out, live=None):
        """Updates the statistics with this step's rewards and writes the scaled
        rewards (float32) into `out`, which it returns; `dones` (terminal | truncated,
        bool) resets the rows' discounted returns after they are counted. `live` as
        in RunningMeanStd.update. Tensors or NumPy arrays (an array `out` is written
        through a view); no host read."""
        rewards = torch.as_tensor(rewards)
        self.returns.mul_(self.gamma).add_(rewards)
        self.stats.update(self.returns, live)
        # float32 reward x float32 factor, the factor rounded once from float64.
        factor = (1.0 / torch.sqrt(self.stats.var + EPSILON)).to(torch.float32)
        scaled = torch.mul(rewards, factor, out=torch.as_tensor(out))
        scaled.clamp_(-self.clip, self.clip)
        self.returns.masked_fill_(torch.as_tensor(dones), 0.0)
        return out

    def state_dict(self) -> dict:
        return {**self.stats.state_dict(), "returns": self.returns.to("cpu", copy=True),
                "clip": self.clip}

    def load_state_dict(self, state: dict, label: str = "reward scaler") -> None:
        self.stats.load_state_dict(state, label)
        returns = torch.as_tensor(state["returns"], dtype=torch.float64)
        if tuple(returns.shape) != tuple(self.returns.shape):
            raise ValueError(f"{label} has {returns.shape[0] if returns.dim() else 0} rows, "
                             f"this run has {self.returns.shape[0]}")
        self.returns.copy_(returns)
        self.clip = float(state.get("clip", self.clip))
