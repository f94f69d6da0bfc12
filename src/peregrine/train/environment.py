"""Creating the env batch a run trains on, and saving/restoring its state.

Envs come from `peregrine.vector.make` (native batches, multiprocessing and
emulated Gymnasium/PettingZoo envs behind the same batch interface) or, for
`vec.backend = "device"`, from `peregrine.make(..., device=...)`. Each returns a
batch whose `reset`/`step` hand back the env's own buffers, updated in place.

`vec.split = 2` with the native backend makes the batch a `vector.Serial` of two
native blocks of num_envs / 2 instances over one set of buffers (rows [0, R/2)
and [R/2, R)), seeded as that backend seeds its blocks (block b: seed + b*phi).
With the multiprocessing backend (any env, emulated ones included) the batch is
made as without the split, and its workers form two groups (an even
vec.num_workers). The trainer steps the blocks separately (`split_blocks`,
collect.SplitCollector); everything else (reset, stream seeding, per-instance
state, episode statistics) goes through the whole batch as for any vector env.

Exact resume. A native batch's future is fully determined by its per-instance
state (`get_state`) plus each instance's random stream. The streams cannot be
read back, so the trainer re-derives every stream from (seed, update index) at
the start of each update (`reseed_streams`, one C call, microseconds; episodes
in progress are untouched). A checkpoint taken at an update boundary then needs
only the per-instance states: resuming restores them and derives the same
streams, and the run continues bit for bit as if never stopped. Envs without
`get_state`/stream seeding (some vector backends) resume from fresh episodes.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from ..envs.native.protocols import (ActionMaskColumns, BulkState, ExactState,
                                     StructuredRows)

MASK64 = (1 << 64) - 1


def make_env(config, seed: int | None = None, device=None):
    """The batch described by `config.env` and `config.vec`; `device` is the trainer's
    (vec.backend = "device" puts the env there, with torch-tensor buffers)."""
    vec = config.vec
    seed = config.train.seed if seed is None else seed
    if not config.is_native:     # Gymnasium, PettingZoo or a factory, emulated in workers
        from .. import vector
        return vector.make(config.env_source(), backend=vec.backend, num_envs=vec.num_envs,
                           num_workers=vec.num_workers, seed=seed)
    kwargs = config.env_kwargs
    if vec.backend == "device":
        from ..envs.registry import make
        return make(config.env_name, num_envs=vec.num_envs, seed=seed,
                    num_threads=vec.num_threads, device=device or "cpu", **kwargs)
    from .. import vector
    if vec.split > 1 and vec.backend == "native":   # validated: num_envs divisible by split
        return vector.make(config.env_name, backend="serial", num_envs=vec.num_envs,
                           num_workers=vec.split, num_threads=vec.num_threads, seed=seed,
                           **kwargs)
    return vector.make(config.env_name, backend=vec.backend, num_envs=vec.num_envs,
                       num_workers=vec.num_workers, num_threads=vec.num_threads,
                       seed=seed, **kwargs)


def split_blocks(env, count: int = 2) -> list:
    """The halves of a `vec.split` env (make_env), in row order: a native backend's
    native batches, each stepping its own rows of the env's buffers when called
    alone, or a Multiprocessing env's worker groups (`count` groups of consecutive
    workers, started and waited for separately)."""
    from ..vector.processes import Multiprocessing
    if isinstance(env, Multiprocessing):      # an even num_workers: config validation
        return env.worker_groups(count)
    return [block.units[0] for block in env.blocks]     # make_env's Serial of native blocks


def stream_seed(seed: int, update: int) -> int:
    """The random-stream seed for update `update` of a run seeded `seed`."""
    return (int(seed) * 0x2545F4914F6CDD1D + (int(update) + 1) * 0x9E3779B97F4A7C15) & MASK64


def reseed_streams(env, seed: int, update: int, derive=None) -> bool:
    """Re-derives every instance's random stream; False if the env cannot.
    `derive` (optional) maps the stream seed to this env's (a rank's slice)."""
    if not isinstance(env, ExactState):
        return False
    seed = stream_seed(seed, update)
    env.seed_streams(seed if derive is None else derive(seed))
    return True


def supports_exact_resume(env) -> bool:
    return isinstance(env, ExactState)


def snapshot(env) -> torch.Tensor | None:
    """Every instance's state as a float64 tensor [num_envs, state_size], or None."""
    if not supports_exact_resume(env):
        return None
    if isinstance(env, BulkState):      # device batches: one transfer, not one per instance
        return torch.from_numpy(env.get_states())
    return torch.from_numpy(np.stack([np.asarray(env.get_state(i), np.float64)
                                      for i in range(env.num_envs)]))


def restore(env, states: torch.Tensor) -> None:
    states = states.numpy()
    if states.shape[0] != env.num_envs:
        raise ValueError(f"checkpoint has env state for {states.shape[0]} instances but the "
                         f"env has num_envs={env.num_envs}")
    if isinstance(env, BulkState):
        env.set_states(states)
        return
    for i in range(env.num_envs):
        env.set_state(i, states[i])


def action_mask_slice(env, env_name, setting="auto", action_space=None, obs_dim=None):
    """The observation columns holding a Discrete env's valid-action mask, or None.

    Read from the env's `action_mask_slice` attribute, else from its registered
    class (vector wrappers do not forward class attributes). None when
    `setting` is "false", the env declares no slice, or the actions are not
    Discrete. A slice that does not fit the spaces is a ValueError.
    """
    from gymnasium import spaces
    if setting == "false":
        return None
    space = env.single_action_space if action_space is None else action_space
    if not isinstance(space, spaces.Discrete):
        return None
    found = env.action_mask_slice if isinstance(env, ActionMaskColumns) else None
    if found is None and env_name is not None:
        from ..envs.registry import ENVS, env_class
        if env_name in ENVS:     # a class attribute: vector wrappers do not forward it
            declared = env_class(env_name)
            found = declared.action_mask_slice if isinstance(declared, ActionMaskColumns) \
                else None
    if found is None:
        found = _mask_key_slice(env.structured_observation_space
                                if isinstance(env, StructuredRows) else None)
    if found is None:
        return None
    if obs_dim is None:
        obs_dim = int(env.single_observation_space.shape[0])
    if not isinstance(found, slice) or found.stop is None or found.stop > obs_dim \
            or len(range(*found.indices(obs_dim))) != int(space.n):
        raise ValueError(f"{env_name}: action_mask_slice {found!r} must cover exactly "
                         f"{int(space.n)} observation columns within {obs_dim}")
    return found


def _mask_key_slice(structure) -> slice | None:
    """The columns of a Dict observation's "action_mask" entry (PettingZoo's and
    Gymnasium's convention for valid actions) in the flat rows, or None."""
    from gymnasium import spaces
    if not isinstance(structure, spaces.Dict):
        return None
    from ..vector.emulation import MASK_KEY
    from ..vector.spaces import FlatObservation
    if MASK_KEY not in structure.spaces:
        return None
    for path, offset, size in FlatObservation(structure).fields:
        if path == (MASK_KEY,):
            return slice(offset, offset + size)
    return None


class ActionBuffer:
    """What `env.step` receives, written from the policy's actions.

    A host batch gets a NumPy array written through a zero-copy torch view; a device
    batch (`target` = its own `actions` tensor) is written in place on the device,
    and `env.step(array)` then steps on it with no copy and no host sync. Box
    actions are clipped to the space's bounds on the way in (the rollout storage
    keeps the unclipped sample, whose log-prob the loss replays); other spaces are
    copied as they are.

    `pinned` (CUDA learner, host batch; collect.SplitCollector): the array is in
    page-locked memory and `write` is a non-blocking device-to-host copy followed by
    a CUDA event, so the caller's thread does not wait for the GPU; whoever hands
    `array` to `env.step` calls `wait()` first (the event's synchronize). Without
    it `write` is a plain (synchronous) copy and `wait()` does nothing. Only on
    CUDA: pinned memory and events need it (refused otherwise).
    """

    def __init__(self, action_space, rows: int, device, target: torch.Tensor | None = None,
                 pinned: bool = False):
        from gymnasium import spaces
        device = torch.device(device)
        if pinned and (target is not None or device.type != "cuda"):
            raise ValueError("a pinned ActionBuffer is for a host batch fed from a CUDA "
                             f"learner (device {device}, target given: {target is not None})")
        self.copied = None           # the CUDA event after a pinned write
        if target is not None:
            self.array = self.view = target
        elif pinned:
            self.view = torch.from_numpy(
                np.zeros((rows, *action_space.shape), dtype=action_space.dtype)).pin_memory()
            self.array = self.view.numpy()
            self.copied = torch.cuda.Event()
        else:
            self.array = np.zeros((rows, *action_space.shape), dtype=action_space.dtype)
            self.view = torch.from_numpy(self.array)
        self._copy = self.view.copy_ if self.copied is None else self._copy_pinned
        self.write = self._copy
        if isinstance(action_space, spaces.Box):
            self.low = torch.as_tensor(action_space.low, dtype=torch.float32, device=device)
            self.high = torch.as_tensor(action_space.high, dtype=torch.float32, device=device)
            self.write = self._write_clipped

    def _write_clipped(self, actions: torch.Tensor) -> None:
        self._copy(torch.maximum(torch.minimum(actions, self.high), self.low))

    def _copy_pinned(self, actions: torch.Tensor) -> None:
        self.view.copy_(actions, non_blocking=True)
        self.copied.record()

    def wait(self) -> None:
        """Blocks until the last `write` has reached `array` (pinned only; the CUDA
        event's synchronize releases the GIL while it waits)."""
        if self.copied is not None:
            self.copied.synchronize()


class StepClock:
    """Seconds spent in `env.step` during one rollout. A host batch is timed with
    the wall clock; a CUDA batch's step returns before the kernel has run, so it
    is timed with CUDA events, read once at the end of the rollout (one sync,
    outside the step loop)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total = 0.0
        self.events: list = []
        self._tick = 0.0

    def restart(self) -> None:
        self.total, self.events = 0.0, []

    def start(self) -> None:
        if self.cuda:
            self.events.append(torch.cuda.Event(enable_timing=True))
            self.events[-1].record()
        else:
            self._tick = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.events.append(torch.cuda.Event(enable_timing=True))
            self.events[-1].record()
        else:
            self.total += time.perf_counter() - self._tick

    def seconds(self) -> float:
        if self.cuda and self.events:
            self.events[-1].synchronize()
            self.total = sum(begin.elapsed_time(end) for begin, end
                             in zip(self.events[::2], self.events[1::2])) / 1000.0
            self.events = []
        return self.total


# What the trainer reads of an env object (Trainer(config, env=...)).
BATCH_MEMBERS = ("num_agents", "single_observation_space", "single_action_space",
                 "observations", "reset", "step", "episode_stats", "close")


def recorded_world(config, env):
    """The config a run on the env object `env` records. An object without the batch
    interface is a TypeError naming what makes one; a native env (or a vector env of
    one) under another name than config.env's is refused; where its fields differ
    from config.env's, a warning names them and the record takes the env's, so the
    checkpoint's world is the one that trained (eval and make_trained_env rebuild it)."""
    from ..envs.native.protocols import Configured
    missing = [member for member in BATCH_MEMBERS if not hasattr(env, member)]
    if missing:
        raise TypeError(
            f"Trainer(config, env=...) needs a batch (peregrine.make, peregrine.vector.make "
            f"or an object with the batch interface), got {type(env).__name__}, which has no "
            f"{', '.join(missing)}: peregrine.vector.make(lambda: YourEnv(), num_envs=N) "
            f"makes one of a Gymnasium or PettingZoo env; without env=, the trainer makes "
            f"config.env's itself")
    from ..vector.sources import is_native_name
    name = getattr(env, "name", None)
    if not (isinstance(env, Configured) and isinstance(name, str) and is_native_name(name)):
        return config
    if name != config.env_name:
        raise ValueError(f"the env object is {name!r} but config.env.name is "
                         f"{config.env_name!r}: a config's hyperparameters and recorded world "
                         f"are its env's; load_config({name!r}) gives {name}'s")
    from .checkpoint import describe_differences, world_differences
    differences = world_differences(config.env_kwargs, name, env)
    if not differences:
        return config
    import warnings
    warnings.warn(f"the env object differs from config.env "
                  f"({describe_differences(differences, 'config')}); the run trains on the "
                  f"env object and records its values", UserWarning, stacklevel=3)
    recorded = {**config.env, **{key: theirs for key, (_, theirs) in differences.items()}}
    return dataclasses.replace(config, env=recorded)
