"""Generalised advantage estimation over the rollout storage, all rows at once."""
from __future__ import annotations

import numpy as np
import torch


def compute_gae(rewards, values, dones, last_value, gamma: float, lam: float, out=None,
                importance=None):
    """Generalised advantage estimates for [T, rows] tensors, all rows at once.

    `importance` (optional, [T, rows]): clipped importance weights
    min(1, pi(a|s) / mu(a|s)) of samples collected by an older behaviour policy
    mu (train.overlap). They weight each TD error and cut the trace, as
    V-trace does (rho = c = the clipped ratio):
    A_t = w_t * delta_t + gamma * lam * w_t * (1 - done_t) * A_{t+1}.
    With every weight 1 (on-policy) this is plain GAE.

    `dones[t]` is True where the episode ended on step t (terminal or
    truncated; truncated rows carry their bootstrap inside `rewards`), and
    `last_value` is V of the observation after the last step.

    On CPU the reverse loop runs in NumPy on zero-copy views of the tensors:
    per time step it is one multiply-add over the rows either way, and NumPy's
    per-call overhead is a fraction of torch's (benchmarks/bench_train.py,
    `gae` part: 2-4x faster at horizon 16-32, equal at 128 x 4096). On other
    devices the same loop runs in torch.
    """
    horizon = rewards.shape[0]
    advantages = torch.empty_like(rewards) if out is None else out
    if rewards.device.type == "cpu":
        r, v, d = rewards.numpy(), values.numpy(), dones.numpy()
        last, adv = last_value.numpy(), advantages.numpy()
        not_done = 1.0 - d.astype(np.float32)
        deltas = r - v
        deltas[:-1] += np.float32(gamma) * v[1:] * not_done[:-1]
        deltas[-1] += np.float32(gamma) * last * not_done[-1]
        decay = np.float32(gamma * lam) * not_done
        if importance is not None:
            weights = importance.numpy()
            deltas *= weights
            decay *= weights
        adv[horizon - 1] = deltas[horizon - 1]
        for t in range(horizon - 2, -1, -1):
            np.multiply(decay[t], adv[t + 1], out=adv[t])
            adv[t] += deltas[t]
        return advantages
    result = gae_scan(rewards, values, dones, last_value, gamma, lam, importance)
    return advantages.copy_(result)


def gae_scan(rewards, values, dones, last_value, gamma: float, lam: float, importance=None):
    """compute_gae's torch path, returning a new [T, rows] tensor.

    Written as one chain of out-of-place elementwise ops over the rows (no
    writes into slices), so torch.compile fuses the whole reverse recursion into
    a fixed number of kernels whatever the horizon, instead of a launch or more
    per time step: with train.compile on CUDA the trainer runs it compiled
    (tests/test_train_compile.py checks the kernel count on the CPU build of
    the same graph). Eager, it is T multiply-adds and one stack.
    """
    not_done = 1.0 - dones.float()
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)], 0)
    deltas = rewards + gamma * next_values * not_done - values
    decay = (gamma * lam) * not_done
    if importance is not None:
        deltas = deltas * importance
        decay = decay * importance
    steps = [deltas[-1]]
    for t in range(rewards.shape[0] - 2, -1, -1):
        steps.append(torch.addcmul(deltas[t], decay[t], steps[-1]))
    return torch.stack(steps[::-1])


def fill_advantages(storage, last_value, gamma: float, lam: float, gae=compute_gae,
                    importance=None) -> None:
    """The rollout's advantages and returns (advantages + values) into `storage`,
    by `gae` (compute_gae, or train.compile's fused scan on CUDA); `last_value` is
    V of the observation after the last step, `importance` as in compute_gae."""
    extra = {} if importance is None else {"importance": importance}
    gae(storage.rewards, storage.values, storage.dones, last_value, gamma, lam,
        out=storage.advantages, **extra)
    torch.add(storage.advantages, storage.values, out=storage.returns)
