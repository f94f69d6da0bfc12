"""torch.compile of the trainer's two hot functions (`train.compile = true`, opt-in).

* The rollout step: the policy forward and sampling
  (`collect.policy_step`). torch.compile cannot take a `torch.Generator`,
  so the step's random numbers are drawn eagerly (`Policy.draw`) and passed in:
  a seed draws the same numbers, in the same order, as on the eager path.
* The minibatch loss: the policy's evaluation and `loss.ppo_loss`, whose
  backward AOTAutograd compiles with it (`loss.backward()` runs the compiled
  backward). Gradient clipping and the fused Adam step stay eager. The compiled
  loss always computes the minibatch statistics (one graph, not one per
  `record` flag; the trainer keeps only the ones it records).

Shapes are fixed (`dynamic=False`): the rollout step always sees every row, and
the loss is compiled for `train.minibatch_size` samples. A minibatch of another
size (an epoch's remainder, or fewer samples when dead agents' rows are left
out) runs the eager loss (`ShapeRouted`), so an update never recompiles.

Both functions are compiled once, at construction, by a warm-up call on the
zero-filled storage with a throwaway generator (the trainer's generator, the
weights and the optimizer state are untouched). That compile time is
`Trainer.compile_seconds`, reported as `compile_seconds` in every update's
record and excluded from the updates' time split and SPS.

Dynamo keeps its compiled code per function: a later trainer in the same
process with the same shapes and settings reuses it (its compile_seconds is
near 0), and one that differs compiles its own version. Past
`torch._dynamo.config.recompile_limit` versions (8 by default) Dynamo refuses
to compile (with fullgraph): that trainer's warm-up fails and it trains eagerly,
with the warning.

On CUDA, GAE too (`compiled_gae`): advantages.gae_scan compiled, so the
reverse recursion over the horizon is a fixed number of fused kernels (3 in
the CPU build of the same graph, for any horizon) instead of launches per time
step. On the CPU the trainer keeps NumPy's loop, as fast or faster there.

Modes: the default inductor mode on the CPU (C++ kernels, so a C++ compiler is
needed), `mode="reduce-overhead"` (CUDA graphs) on CUDA (on an H200 with the envs
on the GPU: 1.87x CartPole's and 1.75x DroneSwarm's eager SPS; benchmarks/RESULTS.md,
"GPU first light").

Refused by the compatibility table (config.INCOMPATIBLE), by name: `policy.lstm`
(Dynamo does not trace `nn.LSTM`, and the fused LSTM replay cuts segments at
episode starts with a host read), `train.teacher`, `train.overlap`, `vec.split = 2`. With several ranks
(data parallel) every minibatch carries the global advantage statistics, so the
warm-up compiles the loss with them. Where torch.compile cannot run (no C++ compiler for the
CPU backend, a Python or platform torch.compile does not support, or a compile
error), the trainer warns once, naming why, and trains eagerly.
"""
from __future__ import annotations

import sys
import time
import warnings
from typing import NamedTuple

import torch

from .advantages import compute_gae, gae_scan
from .collect import policy_step, with_drawn_noise


def unavailable_reason(device: torch.device) -> str | None:
    """Why torch.compile cannot run here for `device`, or None when it can."""
    try:
        import torch._dynamo
    except Exception as error:  # noqa: BLE001 - any import failure means no compiler
        return f"torch._dynamo cannot be imported ({error})"
    if not torch._dynamo.is_dynamo_supported():
        return (f"torch {torch.__version__} does not support torch.compile on Python "
                f"{sys.version_info.major}.{sys.version_info.minor} / {sys.platform}")
    if device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler
            get_cpp_compiler()          # runs `<compiler> --version`
        except Exception as error:  # noqa: BLE001 - no usable compiler, whatever the cause
            return (f"no C++ compiler for inductor's CPU backend ({type(error).__name__}; "
                    f"install g++ or clang++, or set CXX)")
    return None


def compile_function(function, device: torch.device):
    """`function` wrapped by torch.compile for `device` (module docstring: modes)."""
    if device.type != "cuda":
        return torch.compile(function, fullgraph=True, dynamic=False)
    graphed = torch.compile(function, fullgraph=True, dynamic=False, mode="reduce-overhead")

    def call(*args):
        # Each call is its own CUDA-graph step: its outputs are copied out (storage,
        # loss statistics) before the next call replays over their memory.
        torch.compiler.cudagraph_mark_step_begin()
        return graphed(*args)
    return call


def warn_eager(reason: str) -> None:
    warnings.warn(f"train.compile = true but torch.compile is unavailable: {reason}; "
                  f"training eagerly", RuntimeWarning, stacklevel=4)


class ShapeRouted:
    """The compiled minibatch loss for minibatches of `size` samples, the eager one
    for any other size (which would otherwise compile a new graph)."""

    def __init__(self, compiled, eager, size: int):
        self.compiled, self.eager, self.size = compiled, eager, size

    def __call__(self, batch, teacher_weight: float = 0.0, record: bool = True):
        if batch["advantages"].shape[0] == self.size:
            return self.compiled(batch)
        return self.eager(batch, teacher_weight, record)


class Compiled(NamedTuple):
    policy_step: object     # collect.policy_step's signature, compiled inside
    loss: ShapeRouted       # Trainer._eager_loss's signature
    seconds: float          # compile time (the warm-up calls)
    gae: object             # advantages.compute_gae's signature (compiled on CUDA only)


def compiled_gae(device: torch.device):
    """compute_gae with its torch path (advantages.gae_scan) compiled: the reverse
    recursion over the horizon fused into a fixed number of kernels."""
    scan = compile_function(gae_scan, device)

    def gae(rewards, values, dones, last_value, gamma, lam, out):
        return out.copy_(scan(rewards, values, dones, last_value, gamma, lam))
    return gae


def compile_trainer(trainer) -> Compiled | None:
    """The trainer's rollout step and minibatch loss compiled, each run once on the
    zero-filled storage so the compile happens now (timed); None, after one warning
    naming why, where torch.compile cannot run. The trainer's generator, weights,
    gradients and optimizer state are left as they were."""
    device, policy, storage = trainer.device, trainer.policy, trainer.storage
    reason = unavailable_reason(device)
    if reason is not None:
        warn_eager(reason)
        return None
    if trainer.config.train.deterministic:
        # The public call also sets inductor's own flag (torch_startup.py skips it).
        torch.use_deterministic_algorithms(True, warn_only=True)
    start = time.perf_counter()
    step = with_drawn_noise(policy, compile_function(
        policy_step(policy, trainer.autocast, compilable=True), device))
    eager_loss = trainer._eager_loss
    loss = compile_function(lambda batch: eager_loss(batch, 0.0, True), device)
    generator = torch.Generator(device=device)   # throwaway: the trainer's draws stay put
    try:
        with torch.no_grad():               # as in the rollout (a grad-mode guard)
            state = trainer.rollout_state
            step(storage.obs[0], state.lstm, state.starts, generator, storage.step_mask(0),
                 storage.step_critic_states(0))
        epoch = next(iter(storage.flat_minibatches(trainer.config.train.minibatch_size, 1,
                                                   generator)))
        batch, _ = next(epoch)
        if trainer.dist is not None and trainer.config.train.norm_adv:
            # data parallel: every minibatch carries the global advantage statistics
            one = batch["advantages"].new_ones(())
            batch["advantage_stats"] = (one * 0.0, one)
        loss(batch)[0].backward()           # compiles the backward too
        # GAE: on CUDA one fused scan instead of launches per time step; on the CPU
        # NumPy's loop is as fast as the compiled kernel or faster (RESULTS.md).
        gae = compiled_gae(device) if device.type == "cuda" else compute_gae
        if gae is not compute_gae:
            t = trainer.config.train        # gamma and lambda are constants of the graph
            gae(storage.rewards, storage.values, storage.dones, storage.values[0], t.gamma,
                t.gae_lambda, torch.empty_like(storage.advantages))
    except Exception as error:  # noqa: BLE001 - any compile failure falls back, named
        warn_eager(f"compiling failed with {type(error).__name__}: {error}")
        return None
    finally:
        trainer.optimizer.zero_grad(set_to_none=True)
    return Compiled(step, ShapeRouted(loss, eager_loss, batch["advantages"].shape[0]),
                    time.perf_counter() - start, gae)
