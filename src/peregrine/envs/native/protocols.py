"""The batch interface, declared: what every env batch offers and what some add.

"The batch is the environment": a native C batch (`batch.NativeEnv`), a device
batch (`envs.gpu.batch`), the vector backends (`vector.Serial`,
`vector.Multiprocessing`), the emulations of Gymnasium and PettingZoo envs and the
Python reference batches all present the same buffers and methods. `Batch` is
that contract; a batch of your own that implements it trains with
`Trainer(config, env=your_batch)` and every client in `peregrine.vector`.

Capabilities beyond it are small protocols of their own, which the trainer and
the adapters test with `isinstance` (each is `runtime_checkable`):

* `ExactState`: per-instance state read and written, and random streams that can
  be re-derived from a seed: a checkpoint resumes the run bit for bit
  (train/environment.py). Native batches have it; an emulated env cannot.
* `BulkState`: the same states as one array in one call (device batches: one
  transfer instead of one per instance).
* `GlobalState`: a global state per instance (`state_dim` > 0) that
  `enable_states` starts writing, for a centralised critic (train/critic_states.py).
* `InstanceReset`, `InstanceStats`: resetting chosen instances
  (`reset_instances`) and their own episode statistics (`instance_stats`), which
  the Gymnasium/PettingZoo exports use for per-env autoreset and infos.
* `AgentMasks`, `StructuredRows`, `ObservationSlots`, `ActionMaskColumns`,
  `NamedStats`, `Configured`: what the rows mean beyond their shape (live agent
  rows, an emulated env's own observation space, repeated slots, valid-action
  columns), the names of its episode statistics, and the env config a batch was
  made with.

A vector backend offers ExactState only over native envs: it installs those
three methods on the instance when its recipe is native (vector/base.py), so
`isinstance(env, ExactState)` answers for the object in hand.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Batch(Protocol):
    """Rows of one or more env instances over flat buffers, updated in place.

    Buffers (NumPy arrays, or torch tensors for a device batch), one row per agent
    row (`num_agents` = num_envs x agents_per_env): `observations` [rows, obs_dim],
    `final_observations` (the observation an episode ended on, before its reset),
    `actions`, `rewards` float32, `terminals` / `truncations` uint8 (and, where
    agents can be absent, `masks`: `AgentMasks`). `reset(seed)` -> (observations, infos); `step(actions)` -> (observations,
    rewards, terminals, truncations, infos), the same buffers each time;
    `episode_stats(clear)` the finished episodes' statistics (`episode_return` and
    `episode_length`, and more where the batch names them: `NamedStats`)."""

    num_envs: int
    num_agents: int
    agents_per_env: int
    single_observation_space: Any
    single_action_space: Any
    observations: Any
    final_observations: Any
    actions: Any
    rewards: Any
    terminals: Any
    truncations: Any

    def reset(self, seed: int | None = None) -> tuple: ...

    def step(self, actions) -> tuple: ...

    def episode_stats(self, clear: bool = True): ...

    def close(self) -> None: ...


@runtime_checkable
class ExactState(Protocol):
    """Per-instance state and re-derivable random streams (exact resume)."""

    def seed_streams(self, seed: int) -> None: ...

    def get_state(self, instance: int): ...

    def set_state(self, instance: int, state) -> None: ...


@runtime_checkable
class BulkState(Protocol):
    """Every instance's state in one call ([num_envs, state_size] float64)."""

    def get_states(self): ...

    def set_states(self, states) -> None: ...


@runtime_checkable
class GlobalState(Protocol):
    """A global state per instance for a centralised critic (`state_dim` > 0 when
    the env defines one). After `enable_states()` the batch also holds `states`
    (float32 [num_envs, state_dim], written at every reset and step) and
    `final_states` (the state each instance's episode ended on, for the rows that
    just ended), beside `num_envs` and `agents_per_env`: what train/critic_states.py
    reads."""

    state_dim: int

    def enable_states(self, *args, **kwargs): ...


@runtime_checkable
class InstanceStats(Protocol):
    """Per-instance statistics of the last finished episodes (instance_stats)."""

    def instance_stats(self, clear: bool = True) -> tuple: ...


@runtime_checkable
class InstanceReset(Protocol):
    """Resetting the instances a boolean mask selects."""

    def reset_instances(self, mask, seeds=None) -> tuple: ...


@runtime_checkable
class StructuredRows(Protocol):
    """Flat rows that encode an observation space of another shape (an emulated
    env's Dict, Tuple or image space; None for rows that are the space)."""

    structured_observation_space: Any


@runtime_checkable
class ObservationSlots(Protocol):
    """Groups of repeated slots in the observation row (DroneSwarm's nearest
    victims, say) that `policy.slot_encoder` encodes as sets:
    ((name, first column, count, width), ...)."""

    observation_slots: tuple


@runtime_checkable
class ActionMaskColumns(Protocol):
    """Observation columns that hold a Discrete action space's valid-action mask."""

    action_mask_slice: slice


@runtime_checkable
class AgentMasks(Protocol):
    """Which rows hold a live agent (a row per possible agent; without it every
    row is live)."""

    masks: Any


@runtime_checkable
class NamedStats(Protocol):
    """The names of the statistics `episode_stats` reports (without them:
    `DEFAULT_STATS`)."""

    stat_names: tuple


DEFAULT_STATS = ("episode_return", "episode_length")


def stat_names(env) -> tuple:
    """The names of a batch's episode statistics (DEFAULT_STATS without NamedStats)."""
    return tuple(env.stat_names) if isinstance(env, NamedStats) else DEFAULT_STATS


@runtime_checkable
class Configured(Protocol):
    """The env config it was made with (a native env's resolved fields)."""

    config: dict


def env_config(env) -> dict:
    """The env config a batch was made with (a copy; {} for a batch without one)."""
    return dict(env.config) if isinstance(env, Configured) else {}
