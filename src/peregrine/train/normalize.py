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

Both live on the host in NumPy (the env's buffers are host arrays); only the
float32 shift/scale used for the policy input is mirrored on the device.
Their state round-trips through `state_dict` / `load_state_dict` as float64
tensors, so a resumed run continues bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

EPSILON = 1e-8


def _float64(value) -> np.ndarray:
    """A checkpoint entry (tensor or array-like) as a float64 array."""
    return np.asarray(value.numpy() if torch.is_tensor(value) else value, dtype=np.float64)


class RunningMeanStd:
    """Exact running mean and population variance per feature (float64)."""

    def __init__(self, shape=()):
        self.shape = tuple(shape)
        self.mean = np.zeros(self.shape, dtype=np.float64)
        self.var = np.ones(self.shape, dtype=np.float64)
        self.count = 0

    def update(self, batch) -> None:
        """Merges a batch of samples (first axis = samples)."""
        batch = np.asarray(batch)
        n = batch.shape[0]
        if n == 0:
            return
        batch_mean = batch.mean(axis=0, dtype=np.float64)
        batch_var = batch.var(axis=0, dtype=np.float64)
        if self.count == 0:
            self.mean[...] = batch_mean
            self.var[...] = batch_var
            self.count = n
            return
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * (self.count * n / total)
        self.mean += delta * (n / total)
        self.var[...] = m2 / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": torch.from_numpy(self.mean.copy()), "var": torch.from_numpy(self.var.copy()),
                "count": int(self.count)}

    def load_state_dict(self, state: dict, label: str = "normaliser") -> None:
        mean, var = _float64(state["mean"]), _float64(state["var"])
        if mean.shape != self.shape or var.shape != self.shape:
            raise ValueError(f"{label} statistics have shape {mean.shape}, expected {self.shape}")
        self.mean[...] = mean
        self.var[...] = var
        self.count = int(state["count"])


class ObservationNormalizer:
    """clip((obs - mean) / sqrt(var + eps)) per feature, into a caller's tensor."""

    def __init__(self, obs_dim: int, clip: float = 10.0, device="cpu"):
        self.stats = RunningMeanStd((obs_dim,))
        self.clip = float(clip)
        self.device = torch.device(device)
        self.shift = torch.zeros(obs_dim, dtype=torch.float32, device=self.device)
        self.scale = torch.ones(obs_dim, dtype=torch.float32, device=self.device)
        self._refresh()

    def _refresh(self) -> None:
        """The float32 shift/scale the policy input uses, refreshed in place (every step)."""
        self.shift.copy_(torch.from_numpy(self.stats.mean))
        self.scale.copy_(torch.from_numpy(1.0 / np.sqrt(self.stats.var + EPSILON)))

    def update(self, observations: np.ndarray, live=None) -> None:
        """Adds the env's observations (host array, only read) to the statistics."""
        self.stats.update(observations if live is None else observations[live])
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
    """Rewards divided by the running std of each row's discounted return, clipped."""

    def __init__(self, rows: int, gamma: float, clip: float = 10.0):
        self.stats = RunningMeanStd(())
        self.returns = np.zeros(rows, dtype=np.float64)
        self.gamma = float(gamma)
        self.clip = float(clip)

    def scale(self, rewards: np.ndarray, dones: np.ndarray, out: np.ndarray, live=None) -> np.ndarray:
        """Updates the statistics with this step's rewards and writes the scaled
        rewards (float32) into `out`; `dones` (terminal | truncated) resets the
        rows' discounted returns after they are counted."""
        self.returns *= self.gamma
        self.returns += rewards
        self.stats.update(self.returns if live is None else self.returns[live])
        np.multiply(rewards, np.float32(1.0 / np.sqrt(self.stats.var + EPSILON)), out=out)
        np.clip(out, -self.clip, self.clip, out=out)
        self.returns[dones] = 0.0
        return out

    def state_dict(self) -> dict:
        return {**self.stats.state_dict(), "returns": torch.from_numpy(self.returns.copy()),
                "clip": self.clip}

    def load_state_dict(self, state: dict, label: str = "reward scaler") -> None:
        self.stats.load_state_dict(state, label)
        returns = _float64(state["returns"])
        if returns.shape != self.returns.shape:
            raise ValueError(f"{label} has {returns.shape[0]} rows, this run has "
                             f"{self.returns.shape[0]}")
        self.returns[...] = returns
        self.clip = float(state.get("clip", self.clip))
