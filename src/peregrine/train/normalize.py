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
the trainer's device for a device batch), and every update is a fixed
sequence of tensor ops with no host read. Live rows (agent masks) are
selected with weighted sums (weight 0 for a dead row), not boolean indexing,
and the sample count is a float64 tensor (exact up to 2**53 samples) beside
the statistics, so a device batch's rollout never waits for the device. Only `state_dict` reads them back
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


def inverse_std(var: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(var + EPSILON) in float64 (rounded once, by the caller, to float32)."""
    return torch.add(var, EPSILON).sqrt_().reciprocal_()


class RunningMeanStd:
    """Exact running mean and population variance per feature (float64 tensors on
    `device`; `count` is a float64 tensor there too)."""

    def __init__(self, shape=(), device="cpu"):
        self.shape = tuple(shape)
        self.device = torch.device(device)
        self.mean = torch.zeros(self.shape, dtype=torch.float64, device=self.device)
        self.var = torch.ones(self.shape, dtype=torch.float64, device=self.device)
        self.count = torch.zeros((), dtype=torch.float64, device=self.device)
        self._mark_synchronised()

    def _mark_synchronised(self) -> None:
        """Remembers the statistics as they are now: what `synchronise` merges onto."""
        self._base = (self.mean.clone(), self.var.clone(), self.count.clone())

    def _increment(self) -> torch.Tensor:
        """[n, mean..., var...] (float64) of the samples merged since the last
        synchronisation, recovered from the union and the base by inverting the merge:
        with a = base count, u = count, n = u - a,
            mean_new = (u * mean - a * mean_base) / n
            var_new  = (u * var - a * var_base - a * n / u * (mean_base - mean_new)**2) / n
        (zeros for n = 0; the variance clamped at 0 against rounding)."""
        base_mean, base_var, base_count = self._base
        n = self.count - base_count
        n_or_1, total_or_1 = n.clamp(min=1), self.count.clamp(min=1)
        mean = (self.count * self.mean - base_count * base_mean) / n_or_1
        spread = (base_mean - mean).square_().mul_(base_count * n / total_or_1)
        var = ((self.count * self.var - base_count * base_var - spread) / n_or_1).clamp_(min=0)
        return torch.cat([n.reshape(1), mean.reshape(-1), var.reshape(-1)])

    def synchronise(self, gather) -> None:
        """Data-parallel ranks: every rank's samples since the last call merged into
        every rank's statistics, so that all ranks leave with the same ones, those of
        every sample any rank has seen (up to float64 rounding). `gather(vector)` returns
        [ranks, len(vector)], each rank's vector in rank order (DataParallel.gather_rows);
        the increments are merged onto the last synchronised statistics in that order,
        the same float64 operations on every rank."""
        rows = gather(self._increment())
        self.mean.copy_(self._base[0])
        self.var.copy_(self._base[1])
        self.count.copy_(self._base[2])
        features = self.mean.numel()
        for row in rows:
            self._merge(row[1:1 + features].view(self.shape),
                        row[1 + features:].view(self.shape), row[0])
        self._mark_synchronised()

    def update(self, batch, live=None) -> None:
        """Merges a batch of samples (first axis = samples; NumPy or torch). `live`
        (optional, bool per sample) keeps only its True rows: every sum over the batch
        is a weighted one, weight 1 for a live row and 0 for a dead one, and their
        number is the weights' sum, so the device is never asked how many there are.
        A weight of 0 removes a row exactly, garbage included: its values are finite
        (the env contract, envs/check.py), and the square of a float32 observation's
        deviation (< 1e78) cannot overflow float64, so weight x value is always 0."""
        batch = torch.as_tensor(batch)
        rows = batch.shape[0]
        if rows == 0:
            return
        # One float64 working copy, reused: the deviations are formed in place, since a
        # fresh batch-sized tensor per op costs more (page faults) than the arithmetic.
        work = self._workspace(batch.shape)
        work.copy_(batch)
        if live is None:
            weights, n = self._ones, rows
            divisor = n
        else:
            keep = torch.as_tensor(live).to(self.device)
            weights = (keep if keep.dtype == torch.bool else keep != 0).to(torch.float64)
            n = weights.sum()
            divisor = n.clamp(min=1)            # an all-dead batch: 0 / 1, then discarded
        # (features, rows) @ weights: the weighted sum of every feature in one pass.
        per_feature, batch_mean, batch_var = self._per_feature, self._batch_mean, self._batch_var
        torch.mv(per_feature, weights, out=batch_mean.view(-1)).div_(divisor)
        work.sub_(batch_mean)
        work.mul_(work)
        torch.mv(per_feature, weights, out=batch_var.view(-1)).div_(divisor)
        self._merge(batch_mean, batch_var, n)

    def _workspace(self, shape) -> torch.Tensor:
        """The float64 scratch tensor for a batch of `shape` and what is derived from
        it: its (features, rows) view, the batch moments' tensors and the all-ones
        weights of its rows (all reallocated when the shape changes)."""
        work = getattr(self, "_work", None)
        if work is None or work.shape != shape:
            work = self._work = torch.empty(shape, dtype=torch.float64, device=self.device)
            self._per_feature = work.view(shape[0], -1).t()
            self._batch_mean = torch.empty_like(self.mean)
            self._batch_var = torch.empty_like(self.var)
            self._ones = torch.ones(shape[0], dtype=torch.float64, device=self.device)
        return work

    def _merge(self, batch_mean, batch_var, n) -> None:
        """Chan et al.'s merge of (mean, var, count) with a batch's, written as weighted
        averages: with a = n / (count + n),
            mean <- lerp(mean, batch_mean, a)
            var  <- lerp(var, batch_var, a) + delta**2 * a * (1 - a),
        delta = batch_mean - mean, which is the population variance of the union.
        `n` is an int, or for a masked batch a float64 tensor that may be 0. lerp is
        exact at both ends, so the first batch is taken as it is (a = 1; the prior
        var of 1 is no sample) and an all-dead batch changes nothing (a = 0), with no
        branch and no host read."""
        total = self.count + n
        if isinstance(n, torch.Tensor):
            total_or_1 = total.clamp(min=1)     # count = n = 0: a = 0, nothing changes
        else:
            total_or_1 = total                  # n > 0
        new_share = n / total_or_1
        spread = (batch_mean - self.mean).square_().mul_(new_share * (self.count / total_or_1))
        self.mean.lerp_(batch_mean, new_share)
        self.var.lerp_(batch_var, new_share).add_(spread)
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
        self._mark_synchronised()


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
        self.scale.copy_(inverse_std(self.stats.var))

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

    def synchronise(self, gather) -> None:
        """RunningMeanStd.synchronise, then the policy input's shift and scale."""
        self.stats.synchronise(gather)
        self._refresh()

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
        factor = inverse_std(self.stats.var).to(torch.float32)
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
