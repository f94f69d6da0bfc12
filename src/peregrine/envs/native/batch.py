"""NativeEnv: the Python face of a batch of C env instances.

A NativeEnv owns (or is handed) seven flat buffers, one row per agent:

    observations        (num_agents, obs_dim)   float32 (uint8 where the env says)
    final_observations  (num_agents, obs_dim)   last observation of rows that just ended
    actions             (num_agents,) int32 | (num_agents, k) int32 | (num_agents, k) float32
    rewards             (num_agents,)           float32
    terminals           (num_agents,)           bool
    truncations         (num_agents,)           bool
    masks               (num_agents,)           bool, True where the agent row is live

`step(actions)` is one C call that steps every instance, auto-resets finished
ones in the same call and writes every result in place: the arrays it returns
ARE these buffers, overwritten by the next step. Copy what you keep.

Terminals and truncations are never merged. On a row that ended (either flag),
`final_observations` holds the observation the episode ended on, written before
the reset replaced it in `observations`; bootstrap truncated rows from it.

The global state (multi-agent envs that define one, e.g. DroneSwarm): one
vector per *instance* describing the whole world, normalised to [-1, 1], for a
centralised critic (MAPPO's value function) while each agent's policy reads
only its own row. It is written only once asked for, by `enable_states()`:

    states              (num_envs, state_dim)   float32, the current state
    final_states        (num_envs, state_dim)   the state an instance's episode ended on

Row r belongs to instance r // agents_per_env. `state_dim` is 0 (and
`single_state_space` None) for envs without one. This is not the exact
snapshot of `get_state`/`set_state` (float64, every counter, for tests and
checkpoints): it is what a learner may observe about everything.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

BUFFER_NAMES = ("observations", "final_observations", "actions", "rewards",
                "terminals", "truncations", "masks")
# What reset and step return, for annotations: the env's own buffers (observations;
# rewards, terminals, truncations) and an infos dict.
ResetResult = tuple[np.ndarray, dict]
StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]


@dataclass
class EpisodeStats:
    """Aggregate of the episodes that finished since the last read.

    `mean` and `std` map each statistic name to its mean and population
    standard deviation over those `count` episodes; both are empty when no
    episode finished (never NaN).
    """

    count: int = 0
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_sums(cls, names, count, sums, squares) -> "EpisodeStats":
        if count == 0:
            return cls()
        mean = {n: s / count for n, s in zip(names, sums)}
        std = {n: float(np.sqrt(max(q / count - mean[n] ** 2, 0.0)))
               for n, q in zip(names, squares)}
        return cls(count, mean, std)


@dataclass
class Buffers:
    """The seven row buffers of a batch (see the module docstring)."""

    observations: np.ndarray
    final_observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    truncations: np.ndarray
    masks: np.ndarray

    @staticmethod
    def layout(num_agents: int, obs_dim: int, obs_dtype, action_shape: tuple, action_dtype):
        """name -> (shape, dtype) for every buffer of a batch."""
        return {
            "observations": ((num_agents, obs_dim), np.dtype(obs_dtype)),
            "final_observations": ((num_agents, obs_dim), np.dtype(obs_dtype)),
            "actions": ((num_agents, *action_shape), np.dtype(action_dtype)),
            "rewards": ((num_agents,), np.dtype(np.float32)),
            "terminals": ((num_agents,), np.dtype(np.bool_)),
            "truncations": ((num_agents,), np.dtype(np.bool_)),
            "masks": ((num_agents,), np.dtype(np.bool_)),
        }

    @staticmethod
    def nbytes(layout) -> int:
        return sum(int(np.prod(shape, dtype=object)) * dtype.itemsize
                   for shape, dtype in layout.values())

    @classmethod
    def check_fits(cls, layout) -> None:
        """MemoryError (saying how much) when the buffers are larger than the RAM.

        Refused up front: with overcommit the allocation (or a shared-memory
        segment) would "succeed" and the first write would bring the OOM killer
        or SIGBUS.
        """
        need, ram = cls.nbytes(layout), physical_memory()
        if need > ram:
            raise MemoryError(f"{layout['rewards'][0][0]:,} rows need {need / 2**30:,.1f} GiB "
                              f"of buffers, more than this machine's {ram / 2**30:,.1f} GiB "
                              f"of RAM; use fewer envs")

    @classmethod
    def allocate(cls, layout) -> "Buffers":
        """Zeroed buffers; MemoryError saying how much when they do not fit."""
        cls.check_fits(layout)
        try:
            return cls(**{name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.items()})
        except MemoryError as error:
            raise MemoryError(f"{layout['rewards'][0][0]:,} rows need "
                              f"{cls.nbytes(layout) / 2**30:,.1f} GiB of buffers: {error}") from None

    @classmethod
    def check(cls, given, layout) -> "Buffers":
        """Validates caller-provided buffers (a Buffers or a mapping)."""
        if isinstance(given, Buffers):
            given = {name: getattr(given, name) for name in BUFFER_NAMES}
        missing = [name for name in BUFFER_NAMES if name not in given]
        if missing:
            raise ValueError(f"buffers is missing {missing}; expected all of {list(BUFFER_NAMES)}")
        for name, (shape, dtype) in layout.items():
            array = given[name]
            if not isinstance(array, np.ndarray):
                raise ValueError(f"buffers[{name!r}] must be a NumPy array, got {type(array).__name__}")
            if array.shape != shape or array.dtype != dtype:
                raise ValueError(f"buffers[{name!r}] must have shape {shape} and dtype {dtype}, "
                                 f"got {array.shape} {array.dtype}")
            if not array.flags.c_contiguous or not array.flags.writeable:
                raise ValueError(f"buffers[{name!r}] must be C-contiguous and writeable")
            if not array.flags.aligned:
                raise ValueError(f"buffers[{name!r}] is not aligned to its {dtype.itemsize}-byte "
                                 f"elements")
        # Each buffer is written by the step: two that share memory would
        # silently overwrite each other.
        spans = sorted((given[name].ctypes.data, given[name].ctypes.data + given[name].nbytes,
                        name) for name in BUFFER_NAMES if given[name].nbytes)
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:
                raise ValueError(f"buffers[{first!r}] and buffers[{second!r}] overlap in "
                                 f"memory; every buffer needs its own")
        return cls(**{name: given[name] for name in BUFFER_NAMES})


class UnknownKeywordError(TypeError, ValueError):
    """A keyword argument that is not a config field (nor another argument).

    A TypeError, as Python raises for any unexpected keyword: callers that pass
    optional keywords and retry without them on that TypeError (TorchRL's
    GymEnv with `frameskip`, SB3's make_vec_env with `render_mode`) work; and a
    ValueError, as Peregrine's other config errors are, so code that catches
    those keeps working. The message starts as Python's does ("got an
    unexpected keyword argument 'name'"), which is what such callers match.
    """


class IndependentCopies:
    """copy.copy makes an independent copy, the same as copy.deepcopy.

    For the adapters that hold a native batch (the Gymnasium and PettingZoo
    views): a shallow copy would share the batch, so closing the copy would
    close the original. The batch itself copies and pickles by construction
    arguments and state (NativeEnv.__reduce__).
    """

    def __copy__(self):
        return copy.deepcopy(self)


def physical_memory() -> int:
    """Bytes of RAM on this machine (a very large number where unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def resolve_seed(seed) -> int:
    """The seed as an int in [0, 2**64) (random for None); ValueError otherwise."""
    if seed is None:
        return int.from_bytes(os.urandom(8), "little")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if seed >= 1 << 64:   # never wrapped: 2**64 + s would silently equal s
        raise ValueError(f"seed must be less than 2**64, got {seed}")
    return int(seed)


class _ClosedBatch:
    """Stands in for the C batch after close(): any use names the problem."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute):
        raise RuntimeError(f"the {self._name} env is closed; make a new one")



def check_action_array(actions, dtype: np.dtype, shape: tuple) -> None:
    """The batch contract's action array, for every backend: a C-contiguous NumPy
    array of `dtype` and `shape`; ValueError naming what differs (with the cast to
    use when only the dtype does). The values' range is the env's to check (the C
    binding's, or vector.base for worker processes)."""
    if type(actions) is not np.ndarray or actions.dtype != dtype or actions.shape != shape:
        # Formatted only here: a dtype's text costs more than the whole check (it is on
        # every step of a vector backend).
        expected = f"a NumPy array of dtype {dtype} and shape {shape}"
        if not isinstance(actions, np.ndarray):
            raise ValueError(f"actions must be {expected}, got {type(actions).__name__}")
        hint = f"; convert with actions.astype(np.{dtype})" if actions.shape == shape else ""
        raise ValueError(f"actions must be {expected}, got dtype {actions.dtype} and "
                         f"shape {actions.shape}{hint}")
    if not actions.flags.c_contiguous:
        raise ValueError("actions must be a C-contiguous array, got a strided view; pass "
                         "np.ascontiguousarray(actions)")


class NativeEnv:
    """A batch of `num_envs` instances of a C env; one row per agent.

    Subclasses set `name`, `native_module` (the compiled binding) and may
    override `resolve_config` (derived defaults, cross-field checks with good
    messages) and `observation_bounds`.
    """

    name: ClassVar[str] = ""
    native_module: ClassVar[ModuleType]
    presets: ClassVar[dict[str, dict[str, Any]]] = {"default": {}}
    # The env's C header, which the GPU batch compiles: set by a plugin or by
    # peregrine.envs.load; None for a built-in env (envs/NAME/NAME.h, by name).
    header: ClassVar[Path | None] = None

    @classmethod
    def gpu_source(cls) -> Path | str:
        """What the GPU compiler builds (envs/gpu/compiler.py header_path): the
        header's path, or a built-in env's name."""
        return Path(cls.header) if cls.header is not None else cls.name

    def __init__(self, num_envs: int = 1, seed: int | None = None, num_threads: int = 1,
                 buffers: dict[str, np.ndarray] | None = None, preset: str = "default",
                 **config: Any) -> None:
        limits = self.native_module
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) \
                or not 1 <= num_envs <= limits.MAX_NUM_ENVS:
            raise ValueError(f"num_envs must be an int in [1, {limits.MAX_NUM_ENVS}], "
                             f"got {num_envs!r}")
        if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)) \
                or not 1 <= num_threads <= limits.MAX_THREADS:
            raise ValueError(f"num_threads must be an int in [1, {limits.MAX_THREADS}], "
                             f"got {num_threads!r}")
        self.num_envs = int(num_envs)
        self.config = self.resolve_config(self.config_with_preset(preset, config))
        self._config_values = [float(self.config[name]) for name in self.config_field_names()]
        dims = self.native_module.describe(self._config_values)
        self.agents_per_env = dims["agents_per_env"]
        self.num_agents = self.num_envs * self.agents_per_env
        self.obs_dim = dims["obs_dim"]
        self.state_dim = int(dims["global_state_dim"])
        self.single_state_space = None if not self.state_dim else \
            spaces.Box(-1.0, 1.0, (self.state_dim,), np.float32)
        self.states = self.final_states = None      # until enable_states()
        self.single_observation_space = self.make_observation_space(dims)
        self.single_action_space = self.make_action_space(dims)
        self._action_shape = (self.num_agents, *self.single_action_space.shape)
        self._action_dtype = self.single_action_space.dtype
        layout = self._layout(self.num_agents, dims)
        self.buffers = Buffers.allocate(layout) if buffers is None else Buffers.check(buffers, layout)
        # After the buffers: batch_space allocates bounds of the batch's size too.
        self.observation_space = batch_space(self.single_observation_space, self.num_agents)
        self.action_space = batch_space(self.single_action_space, self.num_agents)
        b = self.buffers
        self.observations, self.final_observations = b.observations, b.final_observations
        self.actions, self.rewards = b.actions, b.rewards
        self.terminals, self.truncations, self.masks = b.terminals, b.truncations, b.masks
        self._batch = self.native_module.Batch(
            self._config_values, self.num_envs, int(num_threads), b.observations,
            b.final_observations, b.actions, b.rewards, b.terminals, b.truncations, b.masks)
        self.num_threads = int(num_threads)
        self._stat_names = self.native_module.stat_names()
        self._seed = resolve_seed(seed)
        self._first_episode_seed: int | None = None
        self.reset(seed=self._seed)
        # Until the streams move on, reset() without a seed starts this same first
        # episode again: make(seed=s) then reset() plays seed s's first episode, as
        # reset(seed=s) does (the README's and Gymnasium's make-then-reset pattern).
        self._first_episode_seed = self._seed

    # ---- configuration -------------------------------------------------
    @classmethod
    def config_fields(cls):
        """((name, default, min, max, is_integer), ...) from the C header."""
        return cls.native_module.config_fields()

    @classmethod
    def config_field_names(cls) -> list[str]:
        return [f[0] for f in cls.config_fields()]

    @classmethod
    def default_config(cls) -> dict[str, float]:
        return {f[0]: (int(f[1]) if f[4] else f[1]) for f in cls.config_fields()}

    @classmethod
    def config_with_preset(cls, preset: str, overrides: dict) -> dict:
        if preset not in cls.presets:
            raise ValueError(f"unknown preset {preset!r} for {cls.name}; "
                             f"choose one of {sorted(cls.presets)}")
        fields = cls.config_field_names()
        unknown = [key for key in overrides if key not in fields]
        if unknown:
            others = f" (and {unknown[1:]})" if len(unknown) > 1 else ""
            raise UnknownKeywordError(
                f"{cls.__name__}() got an unexpected keyword argument {unknown[0]!r}{others}: "
                f"unknown config field for {cls.name}; valid fields: {fields}")
        return {**cls.presets[preset], **overrides}

    @classmethod
    def resolve_config(cls, config: dict) -> dict:
        """Fills defaults and checks every field against the C bounds, naming it."""
        resolved = cls.default_config()
        resolved.update(config)
        for name, _default, low, high, is_integer in cls.config_fields():
            value = resolved[name]
            # a bool is a flag's value (an integer field of [0, 1]); max_steps=True was 1
            if isinstance(value, (bool, np.bool_)) and not (is_integer and low == 0 and high == 1):
                raise ValueError(f"config field {name!r} must be a number, got {value!r}")
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"config field {name!r} must be a number, got {value!r}") from None
            if not (low <= number <= high):
                raise ValueError(f"config field {name!r} = {value!r} must be in [{low:g}, {high:g}]")
            if is_integer and number != int(number):
                raise ValueError(f"config field {name!r} = {value!r} must be an integer")
            resolved[name] = int(number) if is_integer else number
        return resolved

    # ---- spaces -------------------------------------------------------------
    def observation_bounds(self) -> tuple[Any, Any]:
        """(low, high) per observation feature; unbounded unless overridden."""
        return -np.inf, np.inf

    def make_observation_space(self, dims: dict) -> spaces.Box:
        if dims["obs_dtype"] == "uint8":
            return spaces.Box(0, 255, (self.obs_dim,), np.uint8)
        low, high = self.observation_bounds()
        low = np.broadcast_to(np.asarray(low, np.float32), (self.obs_dim,))
        high = np.broadcast_to(np.asarray(high, np.float32), (self.obs_dim,))
        return spaces.Box(low, high, (self.obs_dim,), np.float32)

    @staticmethod
    def _layout(num_agents: int, dims: dict) -> dict:
        # The action buffer's shape and dtype are the C kind's (NativeEnv's own space; a
        # subclass's override changes only its bounds, as Pendulum's torque).
        action_space = NativeEnv.make_action_space(dims)
        return Buffers.layout(num_agents, dims["obs_dim"], dims["obs_dtype"],
                              action_space.shape, action_space.dtype)

    @classmethod
    def buffer_layout(cls, num_envs: int = 1, preset: str = "default", **config: Any) -> dict:
        """name -> (shape, dtype) of every buffer a batch of `num_envs` instances of this
        config holds (what `buffers=` must give), without making the batch: its C
        env_init sizes them, and no reset or step runs."""
        resolved = cls.resolve_config(cls.config_with_preset(preset, config))
        dims = cls.native_module.describe([float(resolved[name])
                                           for name in cls.config_field_names()])
        return cls._layout(int(num_envs) * dims["agents_per_env"], dims)

    @staticmethod
    def make_action_space(dims):
        kind = dims["action_kind"]
        if kind == "discrete":
            return spaces.Discrete(dims["action_nvec"][0], dtype=np.int32)
        if kind == "multidiscrete":
            return spaces.MultiDiscrete(np.asarray(dims["action_nvec"]), dtype=np.int32)
        return spaces.Box(-1.0, 1.0, (dims["action_dim"],), np.float32)

    # ---- the loop -------------------------------------------------------------
    def reset(self, seed: int | None = None) -> ResetResult:
        """Starts fresh episodes in every instance.

        With a seed, every instance restarts its own stream derived from
        (seed, instance index); without one, streams continue, except that a
        reset() before any step restarts them from the construction seed, so
        make(seed=s) then reset() plays seed s's first episode.
        Returns (observations, infos) where infos is an empty dict.
        """
        if seed is None:
            seed = self._first_episode_seed
        self._first_episode_seed = None
        if seed is not None:
            self._batch.seed(resolve_seed(seed))
        self._batch.reset()
        return self.observations, {}

    def reset_instances(self, mask: np.ndarray, seeds: np.ndarray | None = None) -> ResetResult:
        """Starts fresh episodes in the instances where `mask` (bool
        [num_envs]) is True; the others carry on untouched.

        seeds: None, or one entry per instance (None or a non-negative int):
        an instance given a seed restarts its stream as instance 0 of a batch
        made with that seed would, so its episodes do not depend on its index.
        Returns (observations, infos) like reset().
        """
        mask = self._instance_mask("mask", mask)
        self._first_episode_seed = None
        if seeds is not None:
            seeds = list(seeds)
            if len(seeds) != self.num_envs:
                raise ValueError(f"seeds must hold one entry per instance ({self.num_envs}), "
                                 f"got {len(seeds)}")
            for instance, seed in enumerate(seeds):
                if seed is not None and mask[instance]:
                    self._batch.seed_instance(instance, resolve_seed(seed))
        self._batch.reset(mask)
        return self.observations, {}

    def _instance_mask(self, name, mask):
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ \
                or mask.shape != (self.num_envs,):
            raise ValueError(f"{name} must be a NumPy bool array of shape ({self.num_envs},) "
                             f"(one entry per instance), got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} "
                             f"{getattr(mask, 'shape', '')}")
        return np.ascontiguousarray(mask)

    def seed_streams(self, seed: int) -> None:
        """Restarts every instance's random stream from (seed, instance index)
        without resetting any episode (exact resume uses this)."""
        self._batch.seed(resolve_seed(seed))
        self._first_episode_seed = None

    def step(self, actions: np.ndarray, hold: np.ndarray | None = None) -> StepResult:
        """Steps every instance with `actions` (one row per agent).

        Returns (observations, rewards, terminals, truncations, infos): the
        env's own buffers, updated in place. infos is an empty dict; episode
        statistics come from `episode_stats()`.

        hold: optional bool [num_envs]; held instances are not stepped (state,
        observations, statistics and random stream unchanged, their actions
        ignored) and their rows report reward 0, no terminal, no truncation.
        Gymnasium's next-step autoreset is built on it.
        """
        if (type(actions) is not np.ndarray or actions.dtype != self._action_dtype
                or actions.shape != self._action_shape):
            check_action_array(actions, self._action_dtype, self._action_shape)
        self._first_episode_seed = None   # auto-resets draw from the streams from now on
        if hold is not None:
            self._batch.step(actions, self._instance_mask("hold", hold))
        else:
            self._batch.step(actions)
        return self.observations, self.rewards, self.terminals, self.truncations, {}


    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        """Mean and std of every episode statistic over episodes finished since
        the last clearing read. Names: see `stat_names`."""
        count, sums, squares = self._batch.stats(clear)
        return EpisodeStats.from_sums(self._stat_names, count, sums, squares)

    def instance_stats(self, clear: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(episodes [num_envs], sums [num_envs, k]) per instance since the last
        clearing read, in `stat_names` order. An instance that finished exactly
        one episode has that episode's statistics as its sums."""
        k = len(self._stat_names)
        rows = np.frombuffer(self._batch.instance_stats(clear), np.float64)
        rows = rows.reshape(self.num_envs, 1 + 2 * k)
        return rows[:, 0].astype(np.int64), rows[:, 1:1 + k]

    @property
    def stat_names(self) -> tuple[str, ...]:
        return self._stat_names

    # ---- the global state (module docstring) -----------------------------------
    @property
    def state_space(self) -> spaces.Box | None:
        """The batch's global states, [num_envs, state_dim] in [-1, 1] (None without one)."""
        if self.single_state_space is None:
            return None
        return batch_space(self.single_state_space, self.num_envs)

    def enable_states(self, states: np.ndarray | None = None,
                      final_states: np.ndarray | None = None) -> np.ndarray:
        """Starts writing the global state into `states` / `final_states` (float32
        [num_envs, state_dim], allocated here unless given) at every reset, step and
        set_state; the current states are written at once. Returns `states`. A
        second call without buffers keeps the ones in use. ValueError for an env
        without a global state or for buffers of the wrong kind."""
        if not self.state_dim:
            raise ValueError(f"the {self.name or type(self).__name__} env has no global "
                             f"state (state_dim 0); only multi-agent envs that define one do")
        if states is None and final_states is None and self.states is not None:
            return self.states
        shape = (self.num_envs, self.state_dim)
        given = {"states": states, "final_states": final_states}
        for name, array in given.items():
            if array is None:
                given[name] = np.zeros(shape, np.float32)
            elif not isinstance(array, np.ndarray) or array.shape != shape \
                    or array.dtype != np.float32 or not array.flags.c_contiguous \
                    or not array.flags.writeable:
                raise ValueError(f"{name} must be a writeable C-contiguous float32 NumPy array "
                                 f"of shape {shape}, got {getattr(array, 'dtype', type(array))} "
                                 f"{getattr(array, 'shape', '')}")
        self._batch.attach_states(given["states"], given["final_states"])
        self.states, self.final_states = given["states"], given["final_states"]
        return self.states

    # ---- exact state, for tests and debugging ---------------------------------
    def get_state(self, instance: int) -> np.ndarray:
        return np.asarray(self._batch.get_state(self._instance_index(instance)),
                          dtype=np.float64)

    def set_state(self, instance: int, state: np.ndarray) -> None:
        """Overwrites one instance's state; its observation rows are rewritten."""
        self._batch.set_state(self._instance_index(instance),
                              [float(v) for v in np.asarray(state).ravel()])

    def _instance_index(self, instance):
        """`instance` as the binding takes it: an index too large for a C int is out of
        range like any other (the binding checks the rest, with the same words)."""
        if isinstance(instance, (int, np.integer)) and not -2 ** 31 <= instance < 2 ** 31:
            raise IndexError(f"instance {instance} out of range [0, {self.num_envs})")
        return instance

    # ---- copies and pickles ------------------------------------------------------
    def __reduce__(self):
        """Pickling (pickle, cloudpickle, multiprocessing) and copy.copy /
        copy.deepcopy all rebuild the env from its construction arguments
        (class, num_envs, num_threads, the resolved config; any preset is
        already in it) in a new C batch of its own, and carry over what makes it
        go on exactly as the original would: every instance's exact state
        (get_state/set_state: positions, step counters, the running episode's
        accumulated return and the like), every instance's place in its random
        stream, the contents of the seven row buffers (observations,
        final_observations, last actions, rewards, flags, masks), and the
        global state when it was enabled (`enable_states`, with its final states).

        Not carried: the episode statistics finished but not yet read
        (episode_stats() of the copy starts empty), caller-owned `buffers=`
        (the copy allocates its own), and attributes set on the instance after
        construction. A copy is independent: closing or stepping either leaves
        the other as it was. A closed env cannot be copied (RuntimeError).
        """
        arguments = {"num_envs": self.num_envs, "num_threads": self.num_threads, **self.config}
        snapshot = {
            "seed": self._seed,
            "states": [self._batch.get_state(i) for i in range(self.num_envs)],
            "rng_states": self._batch.rng_states(),
            "buffers": {name: getattr(self.buffers, name).copy() for name in BUFFER_NAMES},
            "first_episode_seed": self._first_episode_seed,
            "final_states": None if self.final_states is None else self.final_states.copy(),
        }
        return _rebuild, (type(self), arguments, snapshot)

    # ---- lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Stops the step threads and releases the buffers; idempotent. Any later
        use raises RuntimeError; closing while another thread steps raises
        RuntimeError and leaves the env open."""
        batch = getattr(self, "_batch", None)
        if batch is not None and not isinstance(batch, _ClosedBatch):
            batch.close()
            self._batch = _ClosedBatch(self.name or type(self).__name__)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"{type(self).__name__}(num_envs={self.num_envs}, agents_per_env="
                f"{self.agents_per_env}, num_threads={self.num_threads})")


def _rebuild(cls: type[NativeEnv], arguments: dict, snapshot: dict) -> NativeEnv:
    """A new batch in the state a pickled or copied env was in (see NativeEnv.__reduce__)."""
    env = cls(seed=snapshot["seed"], **arguments)
    try:
        if snapshot.get("final_states") is not None:   # set_state writes the current ones
            env.enable_states()
            env.final_states[...] = snapshot["final_states"]
        for instance, state in enumerate(snapshot["states"]):
            env._batch.set_state(instance, state)
        env._batch.set_rng_states(np.frombuffer(snapshot["rng_states"], np.uint64))
        for name, values in snapshot["buffers"].items():
            getattr(env.buffers, name)[...] = values
        env._first_episode_seed = snapshot["first_episode_seed"]
    except Exception:
        env.close()
        raise
    return env
