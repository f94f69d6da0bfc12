"""Any Gymnasium env or PettingZoo ParallelEnv behind the native batch contract.

`emulate(env)` wraps one env object into a *unit*: the NativeEnv interface
(seven flat row buffers, in-place `step`, same-step auto-reset with
`final_observations`, `episode_stats`) over a single env. A Gymnasium env is
one row; a PettingZoo env is one row per possible agent, with `masks` saying
which rows took part in the last step. Backends run many units writing into
slices of one set of buffers (see serial.py, processes.py).

Semantics kept identical to the native envs:
* terminals and truncations stay separate; an episode that terminates on the
  step its time limit also fires is reported as terminal only (its
  continuation value is zero), as the native envs do;
* on a row that ended, `final_observations` holds the last observation of the
  episode and `observations` already the first of the next;
* `infos` are dropped (an empty dict, as native); episode statistics are
  `episode_return` and `episode_length`, from `episode_stats()`; a PettingZoo env
  adds its agents' own returns (`agent_returns`).

Strict values. What an env returns is checked before it reaches the buffers, the
same way on every backend (the units are the same objects in Serial and in
Multiprocessing workers), with the env's index in the message: an observation
must have its space's shape exactly (a scalar or a size-1 array is not broadcast
into a Box(4)) and finite values that float32 can hold (not NaN, inf, None or
1e300, which the float32 row would store as inf), a reward must be a real number
within float32's range (not NaN, inf, 1e300, a string or None), and
`terminated`/`truncated` must be bools (Python's or NumPy's). The checks are a
few type tests and one np.isfinite over the row per step, next to a Python env's
own step.
"""
from __future__ import annotations

import math
import re

import numpy as np
from gymnasium import Env as GymnasiumEnv
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from ..envs.native.batch import Buffers, EpisodeStats, NativeEnv
from ..envs.native.protocols import DEFAULT_STATS, Batch, stat_names
from .common import BUFFER_NAMES, buffers_layout
from .spaces import FlatAction, FlatObservation, row_of

STAT_NAMES = DEFAULT_STATS     # what an emulated Gymnasium/PettingZoo env reports
SEED_BOUND = 1 << 31           # a vector env's seeds (one per env, from its seed up) stay below


def is_parallel_env(env) -> bool:
    try:
        from pettingzoo.utils.env import ParallelEnv
        if isinstance(env, ParallelEnv):
            return True
    except ImportError:  # PettingZoo is optional
        pass
    return (hasattr(env, "possible_agents") and callable(getattr(env, "observation_space", None))
            and hasattr(env, "step") and hasattr(env, "reset"))


def is_native_batch(env) -> bool:
    """Anything with the native batch interface (a NativeEnv, a Serial, ...)."""
    return isinstance(env, (NativeEnv, Batch))


NOT_AN_ENV = ("env must create a gymnasium.Env or VectorEnv, a PettingZoo ParallelEnv or a "
              "native Peregrine env, got {}")


TURN_BASED = ("{} is a turn-based PettingZoo env (an AEC env whose metadata does not set "
              "is_parallelizable, as in PettingZoo's classic games): its agents act one at a "
              "time, and Peregrine trains agents that act together, a batch row each (a "
              "ParallelEnv, or an AEC env PettingZoo can convert to one); turn-based "
              "self-play is not supported")


def as_parallel(env):
    """A PettingZoo AEC env as its ParallelEnv (PettingZoo's converter); others unchanged.
    A turn-based AEC env, which PettingZoo cannot convert, is a ValueError saying so."""
    try:
        from pettingzoo.utils.env import AECEnv
    except ImportError:
        return env
    if isinstance(env, AECEnv):
        if not env.metadata.get("is_parallelizable", False):
            raise ValueError(TURN_BASED.format(f"the env {env}"))
        from pettingzoo.utils.conversions import aec_to_parallel
        return aec_to_parallel(env)
    return env


def emulate(env, buffers=None, seed=None, index=0):
    """The unit for one env object (Gymnasium env or VectorEnv, PettingZoo parallel or
    AEC env, or native batch); `index` is its (first) env's index in the vector env,
    for error messages."""
    env = as_parallel(env)
    if isinstance(env, VectorEnv):
        return GymnasiumVectorEmulation(env, buffers=buffers, seed=seed, index=index)
    if isinstance(env, GymnasiumEnv):
        return GymnasiumEmulation(env, buffers=buffers, seed=seed, index=index)
    if is_native_batch(env):
        return CopiedBatch(env, buffers=buffers, seed=seed)
    if is_parallel_env(env):
        return PettingZooEmulation(env, buffers=buffers, seed=seed, index=index)
    raise ValueError(NOT_AN_ENV.format(type(env).__name__))


def single_spaces(env) -> tuple:
    """(observation space, action space) of one row of `env` (an object `emulate` takes),
    without emulating it: a vector env's single spaces, a PettingZoo env's first possible
    agent's (emulation needs every agent to share them). The observation space is the
    env's own (a Dict, an image), before flattening; an env that puts an action mask in
    its info (Discrete actions only) adds it to the rows when emulated."""
    env = as_parallel(env)
    if isinstance(env, VectorEnv) or is_native_batch(env):
        return env.single_observation_space, env.single_action_space
    if isinstance(env, GymnasiumEnv):
        return env.observation_space, env.action_space
    if is_parallel_env(env):
        agent = env.possible_agents[0]
        return env.observation_space(agent), env.action_space(agent)
    raise ValueError(NOT_AN_ENV.format(type(env).__name__))


_REAL = (int, float, np.integer, np.floating)
_COMMON_REALS = frozenset((float, int, np.float64, np.float32))   # one set lookup
# The reward buffers are float32: a finite float64 beyond this is stored as inf.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def returned(result, count: int, call: str, where: str) -> tuple:
    """`result` of the env's `call` ("step" or "reset") when it is a tuple (or list) of
    `count` values, as Gymnasium's and PettingZoo's APIs return; a ValueError naming the
    env and the API otherwise (the old Gym API's 4-tuple step and bare reset among them)."""
    if (type(result) is tuple or type(result) is list) and len(result) == count:
        return result
    spelled = {"step": "(observation, reward, terminated, truncated, info)",
               "reset": "(observation, info)"}[call]
    size = len(result) if isinstance(result, (tuple, list)) else None
    got = type(result).__name__ if size is None else f"a {type(result).__name__} of {size}"
    old = (" (the old Gym API's step returned 4 values, with one `done`: split it into "
           "terminated and truncated)" if call == "step" and size == 4 else
           " (the old Gym API's reset returned the observation alone)" if call == "reset"
           else "")
    raise ValueError(f"{where}'s {call}() returned {got}, not {spelled}{old}")


def checked_reward(value, where: str, agent=None) -> float:
    """`value` as a float when it is a real number that the float32 reward buffer
    holds (finite, within +-3.4e38); ValueError naming `where` (and the agent)
    otherwise. Bools are not rewards (Gymnasium's checker agrees)."""
    if type(value) in _COMMON_REALS:          # the per-step case: ~100 ns
        try:
            number = float(value)
        except OverflowError:                 # an int beyond float's range
            number = math.inf
        if -_FLOAT32_MAX <= number <= _FLOAT32_MAX:     # false for NaN, +-inf, 1e300
            return number
    if isinstance(value, _REAL) and not isinstance(value, (bool, np.bool_)):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
    elif isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf":
        number = float(value)
    else:
        number = None
    for_agent = "" if agent is None else f" for agent {agent!r}"
    if number is None:
        raise ValueError(f"{where} returned a reward{for_agent} that is not a number: "
                         f"{value!r}")
    if not math.isfinite(number):
        raise ValueError(f"{where} returned a reward{for_agent} that is not a finite number: "
                         f"{number!r}")
    if not -_FLOAT32_MAX <= number <= _FLOAT32_MAX:
        raise ValueError(f"{where} returned a reward{for_agent} of {number!r}, beyond float32's "
                         f"range (+-3.4e38): the reward buffer would hold inf; scale the "
                         f"env's rewards down")
    return number


def checked_flag(name: str, value, where: str, agent=None) -> bool:
    """`value` when it is a bool (Python's, NumPy's, or a 0-d bool array);
    ValueError naming `where`, the flag and the value otherwise."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_) or (isinstance(value, np.ndarray) and value.shape == ()
                                       and value.dtype == np.bool_):
        return bool(value)
    for_agent = "" if agent is None else f" for agent {agent!r}"
    raise ValueError(f"{where} returned {name} = {value!r}{for_agent}, which is not a bool")


# A PettingZoo env of up to this many agents reports each agent's return.
PER_AGENT_RETURNS = 8


def agent_returns(agents) -> dict[str, list[int]]:
    """The returns a PettingZoo episode reports beside the mean over its agents, each
    with the positions in `agents` it averages: one per agent for up to
    PER_AGENT_RETURNS agents (`return_first_0`, `return_second_0`: in a two-player
    game the mean is zero-sum noise), else one per kind of agent where there are
    several kinds (the name without its `_N` index: `return_archer`,
    `return_knight`), else none (the mean is every agent's)."""
    agents = [str(agent) for agent in agents]
    if len(agents) <= PER_AGENT_RETURNS:
        return {f"return_{agent}": [position] for position, agent in enumerate(agents)}
    kinds: dict[str, list[int]] = {}
    for position, agent in enumerate(agents):
        kinds.setdefault(f"return_{re.sub(r'_[0-9]+$', '', agent)}", []).append(position)
    return kinds if len(kinds) > 1 else {}


class _Accumulator:
    """Sums for EpisodeStats over finished episodes, in Python."""

    def __init__(self, names=STAT_NAMES):
        self.names = tuple(names)
        self.clear()

    def clear(self):
        self.count = 0
        self.sums = [0.0] * len(self.names)
        self.squares = [0.0] * len(self.names)

    def record(self, *values):
        self.count += 1
        for i, value in enumerate(values):
            self.sums[i] += value
            self.squares[i] += value * value

    def read(self, clear: bool) -> EpisodeStats:
        stats = EpisodeStats.from_sums(self.names, self.count, self.sums, self.squares)
        if clear:
            self.clear()
        return stats


class _Unit:
    """Buffer plumbing shared by the emulations."""

    num_envs = 1
    stat_names = STAT_NAMES
    # Called (no arguments) when an episode of the wrapped env has ended, before the
    # env is reset: `peregrine render` draws the episode's last frame there.
    before_reset = None

    def _init_buffers(self, observation_space, action_space, agents_per_env, buffers):
        self.agents_per_env = agents_per_env
        self.num_agents = self.num_envs * agents_per_env
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = batch_space(observation_space, self.num_agents)
        self.action_space = batch_space(action_space, self.num_agents)
        layout = buffers_layout(self.num_agents, observation_space, action_space)
        self.buffers = (Buffers.allocate(layout) if buffers is None
                        else Buffers.check(buffers, layout))
        for name in BUFFER_NAMES:
            setattr(self, name, getattr(self.buffers, name))
        self.masks[:] = True
        self._action_shape = (self.num_agents, *action_space.shape)
        self._stats = _Accumulator(self.stat_names)

    def _take_actions(self, actions):
        if actions is not self.actions:
            if (not isinstance(actions, np.ndarray) or actions.shape != self._action_shape
                    or actions.dtype != self.actions.dtype):
                raise ValueError(f"actions must be a NumPy array of dtype {self.actions.dtype} "
                                 f"and shape {self._action_shape}, got "
                                 f"{getattr(actions, 'dtype', type(actions).__name__)} "
                                 f"{getattr(actions, 'shape', '')}")
            self.actions[...] = actions

    def _clear_step_outputs(self):
        self.rewards[:] = 0
        self.terminals[:] = False
        self.truncations[:] = False

    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        return self._stats.read(clear)

    def ended_episode(self, index: int):
        """The statistics (in `stat_names` order) of the episode that env `index` of
        this unit ended in the last step, or None when no episode ended there (a
        PettingZoo agent that left an episode still running). Reads and clears the
        unit's record: a unit of one env finishes at most one episode a step."""
        stats = self.episode_stats(clear=True)
        return np.array([stats.mean[name] for name in self.stat_names]) if stats.count else None

    @property
    def structured_observation_space(self):
        """The env's own observation space that each flat row encodes."""
        flat = getattr(self, "flat_observation", None)
        return None if flat is None else flat.source_space

    def close(self):
        """Closes the wrapped env (once; a unit that failed to start has none)."""
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


MASK_KEY = "action_mask"


class GymnasiumEmulation(_Unit):
    """One Gymnasium env as a one-row batch.

    Action masks in `info`: an env with Discrete actions whose reset info holds
    "action_mask" (n values) gets it in its rows: the row then encodes the Dict
    {"observation": its observation, "action_mask": MultiBinary(n)}, read from every
    step's info (the trainer masks invalid actions from that key, as for a Dict
    observation that carries one)."""

    def __init__(self, env, buffers=None, seed=None, index=0):
        self.env = env
        self.where = f"env {index}"
        observation, info = returned(env.reset() if seed is None else env.reset(seed=int(seed)),
                                     2, "reset", self.where)
        space = env.observation_space
        self._mask_in_info = (isinstance(env.action_space, spaces.Discrete)
                              and isinstance(info, dict) and MASK_KEY in info)
        if self._mask_in_info:
            space = spaces.Dict({"observation": space,
                                 MASK_KEY: spaces.MultiBinary(int(env.action_space.n))})
        self.flat_observation = FlatObservation(space)
        self.flat_action = FlatAction(env.action_space)
        self._init_buffers(self.flat_observation.space, self.flat_action.space, 1, buffers)
        self._to_env = self.flat_action.to_env
        self._start(observation, info)

    def _write(self, observation, info, row) -> None:
        if self._mask_in_info:
            if not isinstance(info, dict) or MASK_KEY not in info:
                raise ValueError(f"{self.where} gave an action mask in its reset info but "
                                 f"none in a later info; it must give one with every "
                                 f"observation")
            observation = {"observation": observation, MASK_KEY: info[MASK_KEY]}
        self.flat_observation.write(observation, row, self.where)

    def _start(self, observation, info):
        self._clear_step_outputs()
        self._write(observation, info, self.observations[0])
        self._episode_return, self._episode_length = 0.0, 0

    def reset(self, seed=None):
        self._start(*returned(self.env.reset() if seed is None else
                              self.env.reset(seed=int(seed)), 2, "reset", self.where))
        return self.observations, {}

    def step(self, actions):
        if actions is not self.actions:
            self._take_actions(actions)
        where = self.where
        observation, reward, terminated, truncated, info = returned(
            self.env.step(self._to_env(self.actions[0])), 5, "step", where)
        reward = checked_reward(reward, where)
        if terminated is not True and terminated is not False:
            terminated = checked_flag("terminated", terminated, where)
        if truncated is not True and truncated is not False:
            truncated = checked_flag("truncated", truncated, where)
        buffers = self.buffers
        if terminated or truncated:
            truncated = not terminated
            self._write(observation, info, buffers.final_observations[0])
            self._stats.record(self._episode_return + reward,
                               float(self._episode_length + 1))
            self._episode_return, self._episode_length = 0.0, 0
            if self.before_reset is not None:
                self.before_reset()
            observation, info = returned(self.env.reset(), 2, "reset", where)
        else:
            self._episode_return += reward
            self._episode_length += 1
        buffers.rewards[0] = reward
        buffers.terminals[0] = terminated
        buffers.truncations[0] = truncated
        self._write(observation, info, buffers.observations[0])
        return self.observations, self.rewards, self.terminals, self.truncations, {}


class GymnasiumVectorEmulation(_Unit):
    """A Gymnasium VectorEnv of n envs (ALE's AtariVectorEnv, a SyncVectorEnv, one of
    your own) as an n-row batch: its actions, observations, rewards and flags pass as
    whole arrays, one `step` call per Peregrine step.

    The env must auto-reset in the same step (`metadata["autoreset_mode"]` SameStep:
    the ending step returns the next episode's first observation, with the last one in
    `info["final_obs"]`), which is Peregrine's own contract; the `gym-vec:` source asks
    for it. Other modes are refused: NextStep spends a step per reset that the rows
    cannot show. Values are checked as a Gymnasium env's are (shapes, finite float32
    observations and rewards, boolean flags), over whole arrays."""

    def __init__(self, env, buffers=None, seed=None, index=0):
        self.env = env
        mode = env.metadata.get("autoreset_mode")
        if mode not in (AutoresetMode.SAME_STEP, AutoresetMode.SAME_STEP.value):
            raise ValueError(
                f"{type(env).__name__} auto-resets in mode {getattr(mode, 'value', mode)!r}; "
                f"Peregrine needs SameStep (the last observation in info['final_obs']): make "
                f"it with autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP; a gym-vec: "
                f"env whose own vector env cannot, with env.vectorization_mode = \"sync\"")
        self.num_envs = count = int(env.num_envs)
        self.where = f"vector env {type(env).__name__} (envs {index}-{index + count - 1})"
        self.flat_observation = FlatObservation(env.single_observation_space)
        self.flat_action = FlatAction(env.single_action_space)
        self._init_buffers(self.flat_observation.space, self.flat_action.space, 1, buffers)
        self._returns = np.zeros(count)
        self._lengths = np.zeros(count, np.int64)
        self._ended = np.zeros((count, len(STAT_NAMES)))   # each env's last episode
        self.reset(seed)

    def reset(self, seed=None):
        # The seed is reduced below 2**31 - n: vector envs seed env i with seed + i, and
        # ALE's takes 32-bit seeds, where a unit past the first gets a 63-bit one
        # (unit_seed). Seeds under that bound pass unchanged.
        observations, _ = (self.env.reset() if seed is None else
                           self.env.reset(seed=int(seed) % (SEED_BOUND - self.num_envs)))
        self._clear_step_outputs()
        self.flat_observation.write_batch(observations, self.observations, self.where)
        self._returns[:], self._lengths[:] = 0.0, 0
        return self.observations, {}

    def _checked(self, rewards, terminated, truncated):
        count, where = self.num_envs, self.where
        rewards = np.asarray(rewards)
        if rewards.shape != (count,) or rewards.dtype.kind not in "iuf":
            raise ValueError(f"{where} returned rewards of dtype {rewards.dtype} and shape "
                             f"{rewards.shape}; expected {count} real numbers")
        rewards = rewards.astype(np.float64, copy=False)
        bad = ~(np.abs(rewards) <= _FLOAT32_MAX)          # NaN, +-inf, beyond float32
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            checked_reward(float(rewards[row]), f"{where} (row {row})")
        flags = []
        for name, value in (("terminated", terminated), ("truncated", truncated)):
            value = np.asarray(value)
            if value.shape != (count,) or value.dtype != np.bool_:
                raise ValueError(f"{where} returned {name} of dtype {value.dtype} and shape "
                                 f"{value.shape}; expected {count} bools")
            flags.append(value)
        return rewards, flags[0], flags[1]

    def step(self, actions):
        if actions is not self.actions:
            self._take_actions(actions)
        observations, rewards, terminated, truncated, info = self.env.step(
            self.flat_action.to_env_batch(self.actions))
        rewards, terminated, truncated = self._checked(rewards, terminated, truncated)
        buffers = self.buffers
        self._returns += rewards
        self._lengths += 1
        ended = terminated | truncated
        if ended.any():
            final = info.get("final_obs") if isinstance(info, dict) else None
            if final is None:
                raise ValueError(f"{self.where} ended an episode without info['final_obs']; "
                                 f"a SameStep vector env gives the last observation there")
            for row in np.flatnonzero(ended):
                self.flat_observation.write(row_of(final, row), buffers.final_observations[row],
                                            f"{self.where} (row {row}, its final observation)")
                self._stats.record(float(self._returns[row]), float(self._lengths[row]))
            self._ended[ended, 0], self._ended[ended, 1] = self._returns[ended], self._lengths[ended]
            self._returns[ended], self._lengths[ended] = 0.0, 0
        buffers.rewards[:] = rewards
        buffers.terminals[:] = terminated
        # an episode that terminates as its time limit fires is terminal only
        buffers.truncations[:] = truncated & ~terminated
        self.flat_observation.write_batch(observations, buffers.observations, self.where)
        return self.observations, self.rewards, self.terminals, self.truncations, {}


    def ended_episode(self, index: int):
        """The last episode env `index` ended (its rows hold one env each)."""
        return self._ended[index].copy()


class PettingZooEmulation(_Unit):
    """One PettingZoo ParallelEnv as a batch of one row per possible agent.

    `masks[row]` is True when the env returned an observation for that agent
    in the last step (or reset): the row's observation, reward and flags are
    meaningful. An agent that ends mid-episode reports its terminal/truncation
    once (with its last observation, also in `final_observations`), then its
    row stays masked until an episode includes it again; agents that join
    mid-episode unmask when they first appear. Actions of masked rows are
    ignored. When no agent is left, the episode is recorded
    (`episode_return` = mean over agents of their summed rewards,
    `episode_length` = env steps, and the returns `agent_returns` names: each
    agent's, or each kind's mean over its agents that took part, 0 where none did)
    and the env resets in the same step; rows still live without a flag at that
    moment are marked truncated.
    """

    def __init__(self, env, buffers=None, seed=None, index=0):
        self.env = env
        self.where = f"env {index}"
        self.possible_agents = list(env.possible_agents)
        if not self.possible_agents:
            raise ValueError("the PettingZoo env has no possible_agents")
        first = self.possible_agents[0]
        observation_space, action_space = env.observation_space(first), env.action_space(first)
        for agent in self.possible_agents[1:]:
            if env.observation_space(agent) != observation_space or \
                    env.action_space(agent) != action_space:
                raise ValueError(f"agent {agent!r} has different spaces than {first!r}; "
                                 "emulation needs every agent to share one observation space "
                                 "and one action space")
        self.flat_observation = FlatObservation(observation_space)
        self.flat_action = FlatAction(action_space)
        self._agent_returns = agent_returns(self.possible_agents)
        self.stat_names = (*STAT_NAMES, *self._agent_returns)
        self._init_buffers(self.flat_observation.space, self.flat_action.space,
                           len(self.possible_agents), buffers)
        self._row = {agent: row for row, agent in enumerate(self.possible_agents)}
        self._returns = np.zeros(self.num_agents, np.float64)
        self._took_part = np.zeros(self.num_agents, bool)
        self._episode_length = 0
        self.reset(seed)

    def _mean_return(self, rows) -> float:
        """The mean return of those of `rows` that took part in the episode (0: none)."""
        rows = [row for row in rows if self._took_part[row]]
        return float(self._returns[rows].mean()) if rows else 0.0

    def _check_keys(self, acting, *dicts) -> None:
        """Every agent that acted has an observation, reward, terminated and truncated
        entry (PettingZoo's parallel API; a missing reward would count as 0 and a
        missing flag as False without a word), and every key is a possible agent."""
        for name, plural, values in zip(("observation", "reward", "terminated", "truncated"),
                                        ("observations", "rewards", "terminations",
                                         "truncations"), dicts):
            if not isinstance(values, dict):
                raise ValueError(f"{self.where}'s step returned {plural} as "
                                 f"{type(values).__name__}, not a dict keyed by agent")
            missing = [agent for agent in acting if agent not in values]
            if missing:
                raise ValueError(f"{self.where}'s step gave no {name} for agent(s) {missing}, "
                                 f"which acted in it (every agent in env.agents before the "
                                 f"step needs one; pettingzoo.test.parallel_api_test checks it)")
            self._check_agents(values, f"{'an' if name[0] in 'aeiou' else 'a'} {name}")

    def _check_agents(self, values, what: str) -> None:
        if not all(agent in self._row for agent in values):
            strangers = [agent for agent in values if agent not in self._row]
            raise ValueError(f"{self.where} returned {what} for agent(s) {strangers}, which "
                             f"are not in its possible_agents {self.possible_agents}")

    def _start_episode(self, observations):
        self._check_agents(observations, "an observation")
        self.observations[:] = 0
        for agent, observation in observations.items():
            self.flat_observation.write(observation, self.observations[self._row[agent]],
                                        self.where)
        self._returns[:] = 0.0
        self._took_part[:] = False
        self._episode_length = 0

    def reset(self, seed=None):
        observations, _infos = returned(self.env.reset() if seed is None
                                        else self.env.reset(seed=int(seed)), 2, "reset",
                                        self.where)
        self._clear_step_outputs()
        self._start_episode(observations)
        self.masks[:] = False
        for agent in observations:
            self.masks[self._row[agent]] = True
        return self.observations, {}

    def step(self, actions):
        if actions is not self.actions:
            self._take_actions(actions)
        acting = list(self.env.agents)
        action_dict = {agent: self.flat_action.to_env(self.actions[self._row[agent]])
                       for agent in acting}
        observations, rewards, terminations, truncations, _infos = returned(
            self.env.step(action_dict), 5, "step", self.where)
        self._check_keys(acting, observations, rewards, terminations, truncations)
        self._clear_step_outputs()
        self.masks[:] = False
        row_of, where = self._row, self.where
        for agent, observation in observations.items():
            row = row_of[agent]
            self.flat_observation.write(observation, self.observations[row], where)
            self.masks[row] = True
        for agent, reward in rewards.items():
            row = row_of[agent]
            reward = checked_reward(reward, where, agent)
            self.rewards[row] = reward
            self._returns[row] += reward
            self._took_part[row] = True
        for agent, terminated in terminations.items():
            self.terminals[row_of[agent]] = checked_flag("terminated", terminated, where, agent)
        for agent, truncated in truncations.items():
            row = row_of[agent]
            self.truncations[row] = (checked_flag("truncated", truncated, where, agent)
                                     and not self.terminals[row])
        self._episode_length += 1
        episode_over = not self.env.agents
        if episode_over:  # rows still live without a flag were cut short
            for agent in set(acting) | set(observations):
                row = row_of[agent]
                if not self.terminals[row]:
                    self.truncations[row] = True
        ended = self.terminals | self.truncations
        self.final_observations[ended] = self.observations[ended]
        if episode_over:
            self._stats.record(self._mean_return(range(self.num_agents)),
                               float(self._episode_length),
                               *map(self._mean_return, self._agent_returns.values()))
            if self.before_reset is not None:
                self.before_reset()
            observations, _infos = returned(self.env.reset(), 2, "reset", self.where)
            self._start_episode(observations)
        return self.observations, self.rewards, self.terminals, self.truncations, {}


class CopiedBatch(_Unit):
    """A native batch created by a user callable: it owns its buffers, so its
    results are copied into the unit's rows after every step (one memcpy per
    buffer). Pass a registered env name instead of a callable to get the
    zero-copy path."""

    def __init__(self, env, buffers=None, seed=None):
        self.env = env
        self.num_envs = int(env.num_envs)
        self._init_buffers(env.single_observation_space, env.single_action_space,
                           int(env.agents_per_env), buffers)
        if env.num_agents != self.num_agents:
            raise ValueError(f"native env reports num_agents={env.num_agents}, expected "
                             f"num_envs * agents_per_env = {self.num_agents}")
        self.stat_names = stat_names(env)
        self.reset(seed)

    def _copy_out(self):
        env = self.env
        for name in ("observations", "final_observations", "rewards", "terminals",
                     "truncations", "masks"):
            np.copyto(getattr(self, name), getattr(env, name))

    def reset(self, seed=None):
        self.env.reset(seed=seed)
        self._copy_out()
        return self.observations, {}

    def step(self, actions):
        self._take_actions(actions)
        np.copyto(self.env.actions, self.actions)
        self.env.step(self.env.actions)
        self._copy_out()
        return self.observations, self.rewards, self.terminals, self.truncations, {}

    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        return self.env.episode_stats(clear)

    def ended_episode(self, index: int):
        """Instance `index`'s episodes so far, averaged: its first episode when it first
        ends (what evaluation asks for), from the batch's own per-instance record."""
        episodes, sums = self.env.instance_stats(clear=False)
        return sums[index] / episodes[index] if episodes[index] else None
