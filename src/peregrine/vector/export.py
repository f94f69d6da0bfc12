"""Peregrine envs for other libraries: Gymnasium's Env and VectorEnv, and an SB3 VecEnv.

`GymnasiumEnv` is one instance of a native env as a `gymnasium.Env`
(what `gymnasium.make("peregrine/...")` returns). `GymnasiumVectorEnv` and
`sb3_vec_env` treat each row (agent) of a Peregrine batch as one sub-env, so
a batch of N CartPoles is an N-env vector env; `gymnasium.make_vec` builds
the former over a native batch. They copy what they return (those libraries
keep references to observations across steps), so they cost one copy per
step that the native interface avoids. Rows whose mask is False (absent
agents of a multi-agent env) still appear; the Gymnasium adapter puts
`masks` in infos, SB3 has no notion of them.

All three carry metadata["render_fps"], the frame rate of their env's
renderer (the registry's, or a plugin class's), whatever their render_mode: video
recorders read it (Gymnasium's RecordVideo, SB3's VecVideoRecorder).

Every row of a batch shares the batch's attributes and methods, so the
per-sub-env attribute calls (Gymnasium's get_attr/set_attr/call, SB3's
get_attr/set_attr/env_method) read a batch attribute once per row (a
per-row buffer such as `masks` row by row), and set or call it once for the
whole batch: asking to give rows different values, or to act on only some
rows, is refused with an error saying so.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import Env, spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from ..envs.native.batch import IndependentCopies, UnknownKeywordError
from ..envs.native import drawing
from ..envs.native.protocols import ExactState, InstanceReset, InstanceStats
from ..envs.registry import ENVS, env_class, renderer
from .spaces import action_high

if TYPE_CHECKING:   # stable-baselines3 is optional
    from stable_baselines3.common.vec_env import VecEnv

AUTORESET_MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED)


def check_integer_actions(space, actions: np.ndarray) -> None:
    """ValueError for actions of a discrete space (one agent's `space`) that are not
    integers: casting 0.9 to the action dtype would take action 0, silently."""
    if not isinstance(space, spaces.Box) and actions.dtype.kind not in "iub":
        raise ValueError(f"actions of {space} must be integers, got dtype {actions.dtype}")


def check_action_range(space, actions: np.ndarray) -> None:
    """ValueError for integer actions of a batch's discrete action space (one agent's
    `space`) outside its values, 0..action_high(space)."""
    high = action_high(space)
    if high is None:
        return
    bad = (actions < 0) | (actions > high)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"action {actions[where]} at {where} is outside {space}: expected "
                         f"0..{high.tolist()}")


def _as_actions(env, actions):
    """The batch's action array from whatever a Gymnasium/SB3 caller passes."""
    space = env.single_action_space
    shape = (env.num_agents, *space.shape)
    actions = np.asarray(actions)
    if actions.size != int(np.prod(shape)):
        raise ValueError(f"actions must hold {int(np.prod(shape))} values (shape {shape}), "
                         f"got shape {actions.shape}")
    check_integer_actions(space, actions)
    return np.ascontiguousarray(actions.reshape(shape), dtype=space.dtype)


# ---- rendering ------------------------------------------------------------------------

def _renderer_module(env) -> str | None:
    """The drawing module of the env (the registry's, a plugin class's `renderer`);
    None for an env without one (a Python env in a backend)."""
    name = getattr(env, "name", None)
    return renderer(name) if isinstance(name, str) and name in ENVS else None


def _renderer_fps(env) -> int | None:
    """The fps of the env's renderer; None for an env without one."""
    module_name = _renderer_module(env)
    return None if module_name is None else drawing.render_fps(module_name)


def _render_metadata(env) -> dict:
    """The render entries of a Gymnasium export's metadata: "render_modes"
    (what it can draw) and "render_fps", the renderer's, whatever the
    render_mode: video recorders read it from metadata (Gymnasium's
    RecordVideo, SB3's VecVideoRecorder, which otherwise writes 30 fps)."""
    fps = _renderer_fps(env)
    if fps is None:
        return {"render_modes": []}
    return {"render_modes": ["rgb_array"] if isinstance(env, ExactState) else [],
            "render_fps": fps}


def _renderer(env, render_mode):
    """The name of the env's drawing module, or None when render_mode is None.

    An env that cannot draw refuses render_mode with a TypeError, as an env
    whose constructor takes no render_mode does: callers that ask for frames
    only in case they are available (SB3's make_vec_env) then retry without.
    """
    if render_mode is None:
        return None
    if render_mode != "rgb_array":
        raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
    module_name = _renderer_module(env)
    if module_name is None or not isinstance(env, ExactState):
        raise TypeError(f"render_mode='rgb_array' needs a native batch (peregrine.make) of an "
                        f"env that can draw itself; {type(env).__name__} cannot")
    return module_name      # held by name, so the adapters holding it stay picklable


def _frames(env, renderer):
    """One RGB frame (uint8 [H, W, 3]) per row, each showing its instance; the
    rows of a multi-agent instance each get the instance's frame with their own
    agent marked (the module's agent_frames), so no two tiles of a vector video
    are the same picture."""
    if renderer is None:
        return None
    frames = []
    for instance in range(env.num_envs):
        frame = drawing.frame(renderer, env, instance)
        if env.agents_per_env == 1:
            frames.append(frame)
        else:
            frames.extend(drawing.agent_frames(renderer, env, instance, frame))
    return tuple(frames)


# ---- attributes of the rows, which all share one batch ------------------------------------

def _rows(env, indices):
    """Validated row indices (None: all rows)."""
    if indices is None:
        return list(range(env.num_agents))
    rows = [indices] if isinstance(indices, (int, np.integer)) else list(indices)
    for row in rows:
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) \
                or not 0 <= row < env.num_agents:
            raise IndexError(f"index {row!r} out of range [0, {env.num_agents})")
    return [int(row) for row in rows]


def _row_values(owner, env, name, rows):
    """Attribute `name` of each row: the batch's (or the adapter's) value, row
    by row for per-row buffers."""
    source = env if hasattr(env, name) else owner
    if not hasattr(source, name):
        raise AttributeError(f"neither the env nor its adapter has an attribute {name!r}")
    value = getattr(source, name)
    if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == env.num_agents:
        return [value[row] for row in rows]
    return [value] * len(rows)


def _whole_batch(env, rows, what):
    if sorted(set(rows)) != list(range(env.num_agents)):
        raise ValueError(f"{what} acts on the whole batch, which every row shares; it cannot "
                         f"act on rows {rows} alone (pass indices=None)")


def _set_batch_attr(owner, env, name, values):
    """Sets `name` on the batch (or on the adapter, for its own attributes)."""
    if isinstance(values, (list, tuple)):
        if len(values) != env.num_agents:
            raise ValueError(f"values must hold one value per sub-env ({env.num_agents}) or be "
                             f"a single value, got {len(values)}")
        first = values[0]
        if not all(np.array_equal(value, first) if isinstance(value, np.ndarray)
                   else value is first or value == first for value in values[1:]):
            raise ValueError(f"every row shares the batch's {name!r}: give one value, not "
                             "different values per row")
        values = first
    target = owner if hasattr(owner, name) and not hasattr(env, name) else env
    setattr(target, name, values)


# ---- episode records, as Gymnasium's RecordEpisodeStatistics writes them ------------------

class _EpisodeRecorder:
    """Per-row return, length and start time of the running episodes, and the
    infos["episode"] / infos["_episode"] entries for rows that finished.

    "r" (float64), "l" (int64) and "t" (seconds, rounded to 1e-6) are what
    gymnasium.wrappers.vector.RecordEpisodeStatistics writes, zero on rows that
    did not finish; a native batch adds each of its episode statistics (its
    `stat_names`: e.g. success, delivered) under its own name, taken from the
    batch's per-instance counters, which this reads and clears.
    """

    def __init__(self, env):
        self.env = env
        rows = env.num_agents
        self.returns = np.zeros(rows, np.float64)
        self.lengths = np.zeros(rows, np.int64)
        self.starts = np.full(rows, time.perf_counter())
        self.per_instance = isinstance(env, InstanceStats)

    def restart(self, rows=slice(None)):
        """New episodes start on `rows` (a slice, bool mask or index array)."""
        self.returns[rows] = 0.0
        self.lengths[rows] = 0
        self.starts[rows] = time.perf_counter()

    def record(self, rewards, ended, infos, restarted=None):
        """Adds one step; `restarted` (index array) are rows whose new episode
        starts with this step (next-step autoreset: not stepped, reward 0)."""
        self.returns += rewards
        self.lengths += 1
        if restarted is not None:
            self.restart(restarted)
        rows = np.flatnonzero(ended)  # index arrays: a few rows of many
        if not rows.size:
            return
        size = self.env.num_agents
        episode = {"r": np.zeros(size), "l": np.zeros(size, np.int64), "t": np.zeros(size)}
        episode["r"][rows] = self.returns[rows]
        episode["l"][rows] = self.lengths[rows]
        episode["t"][rows] = np.round(time.perf_counter() - self.starts[rows], 6)
        if self.per_instance:
            counts, sums = self.env.instance_stats(clear=True)
            instances = rows // self.env.agents_per_env
            means = sums[instances] / np.maximum(counts[instances], 1)[:, None]
            for k, name in enumerate(self.env.stat_names):
                episode[name] = np.zeros(size)
                episode[name][rows] = means[:, k]
        infos["episode"] = episode
        infos["_episode"] = ended.copy()
        self.restart(rows)


# ---- Gymnasium ------------------------------------------------------------------------------

class GymnasiumVectorEnv(IndependentCopies, VectorEnv):
    """A Gymnasium VectorEnv over any Peregrine env (native batch or backend).

    autoreset_mode (chosen at construction; see
    https://farama.org/Vector-Autoreset-Mode):
      NEXT_STEP (Gymnasium's default): a sub-env that ends returns its last
        observation; the next step returns the first observation of a new
        episode with reward 0 and no flags, and ignores that row's action.
        Built on the native batch's `hold` (the ended instances are not
        stepped), so it needs a native batch.
      SAME_STEP: an ended sub-env is reset inside the step that ended it; its
        last observation is in infos["final_obs"] (an object array, None where
        the sub-env did not end) with the mask infos["_final_obs"]. Works over
        every backend.
      DISABLED: an ended sub-env returns its last observation and must be
        reset with reset(options={"reset_mask": mask}) before it is stepped
        again; stepping it earlier is refused. Needs a native batch.
      Default (None): NEXT_STEP on a native batch, SAME_STEP on a backend.
    record_episode_statistics: False (default), as for Gymnasium's own vector
      envs: wrap this env in gymnasium.wrappers.vector.RecordEpisodeStatistics
      for infos["episode"]. True writes the same infos["episode"] /
      infos["_episode"] entries itself (cheaper, and with the env's own
      statistics such as `success` beside "r", "l" and "t"); the wrapper then
      refuses to run over it, since it would overwrite them.
    render_mode: None or "rgb_array" (every native env draws itself):
      render() returns one frame per sub-env, each showing its instance; the
      drones of one DroneSwarm instance each get its frame with their own drone
      ringed. A row that just ended shows the next episode's start (the batch
      resets inside the step).

    Copies (copy.copy, copy.deepcopy) and pickles are independent envs over a
    new batch in the same state (see NativeEnv.__reduce__).

    reset(seed=...): an int reseeds every instance from (seed, instance index),
    as the native env does; a list gives each sub-env its own seed (None
    entries keep their stream; rows of one multi-agent instance must agree):
    an instance seeded s then plays as a one-instance env made with seed s.
    reset(options={"reset_mask": mask}) resets only the masked sub-envs (with
    an int seed, instance i of them gets seed + i). Lists and partial resets
    need a native batch; on a backend they are refused.
    """

    def __init__(self, env: Any, copy: bool = True,
                 autoreset_mode: AutoresetMode | str | None = None,
                 record_episode_statistics: bool = False, render_mode: str | None = None) -> None:
        self.env = env
        self.copy = copy
        self.num_envs = env.num_agents
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        native = isinstance(env, InstanceReset)
        if autoreset_mode is None:
            autoreset_mode = AutoresetMode.NEXT_STEP if native else AutoresetMode.SAME_STEP
        try:
            autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ValueError(f"autoreset_mode must be one of {[m.value for m in AUTORESET_MODES]},"
                             f" got {autoreset_mode!r}") from None
        if autoreset_mode != AutoresetMode.SAME_STEP and not native:
            raise ValueError(f"autoreset_mode {autoreset_mode.value!r} needs a native batch "
                             f"(peregrine.make(name, ...)); {type(env).__name__} resets inside "
                             "its step: use autoreset_mode='SameStep'")
        self.autoreset_mode = autoreset_mode
        self._renderer = _renderer(env, render_mode)
        self.render_mode = render_mode
        self.metadata = {"autoreset_mode": autoreset_mode, **_render_metadata(env)}
        self._episodes = _EpisodeRecorder(env) if record_episode_statistics else None
        self._ended = np.zeros(self.num_envs, bool)  # rows that ended on the last step
        self.closed = False

    # ---- reset -------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict | None = None) -> tuple[np.ndarray, dict]:
        options = dict(options or {})
        reset_mask = options.pop("reset_mask", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}: Peregrine envs take only "
                             "'reset_mask' (configure the env when you make it)")
        if reset_mask is None:
            if seed is None or isinstance(seed, (int, np.integer)):
                self.env.reset(seed=seed)
            else:
                self._reset_instances(np.ones(self.env.num_envs, bool), self._row_seeds(seed))
            self._ended[:] = False
            if self._episodes is not None:
                self._episodes.restart()
            return self._out(self.env.observations), {}
        rows = self._check_reset_mask(reset_mask)
        instances = self._instances_of(rows, "options['reset_mask']")
        if seed is None:
            seeds = None
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.env.num_envs)]
        else:
            seeds = self._row_seeds(seed)
        # Rows that ended were already reset by the batch inside that step: they
        # only need a reset of their own when given a seed.
        fresh = ~self._ended.reshape(self.env.num_envs, -1).any(axis=1)
        if seeds is not None:
            fresh |= np.array([s is not None for s in seeds])
        if (instances & fresh).any():
            self._reset_instances(instances & fresh, seeds)
        self._ended[rows] = False
        if self._episodes is not None:
            self._episodes.restart(rows)
        observations = self.env.observations.copy()
        # sub-envs outside the mask that ended still show their last observation
        observations[self._ended] = self.env.final_observations[self._ended]
        return observations, {}

    def _reset_instances(self, instances, seeds):
        if not isinstance(self.env, InstanceReset):
            raise ValueError(f"per-sub-env seeds and reset_mask need a native batch "
                             f"(peregrine.make(name, ...)); {type(self.env).__name__} resets "
                             "all its envs at once: reset(seed=int) without reset_mask")
        self.env.reset_instances(instances, seeds)

    def _check_reset_mask(self, mask):
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ \
                or mask.shape != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must be a NumPy bool array of shape "
                             f"({self.num_envs},), got {getattr(mask, 'dtype', type(mask))} "
                             f"{getattr(mask, 'shape', '')}")
        if not mask.any():
            raise ValueError("options['reset_mask'] must select at least one sub-env")
        return mask.copy()

    def _instances_of(self, rows, what):
        """Per-instance view of a per-row bool array; rows of an instance must agree."""
        per_instance = rows.reshape(self.env.num_envs, self.env.agents_per_env)
        if (per_instance.any(axis=1) != per_instance.all(axis=1)).any():
            raise ValueError(f"{what}: the {self.env.agents_per_env} rows of one instance "
                             "(agents of one multi-agent env) must be selected together")
        return per_instance[:, 0].copy()

    def _row_seeds(self, seed):
        """Per-instance seeds from one seed (or None) per sub-env."""
        if isinstance(seed, (str, bytes)) or not hasattr(seed, "__len__"):
            raise ValueError(f"seed must be an int, None or a list of one per sub-env "
                             f"({self.num_envs}), got {seed!r}")
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"seed as a list must hold one seed per sub-env ({self.num_envs}),"
                             f" got {len(seeds)}")
        agents = self.env.agents_per_env
        per_instance = []
        for instance in range(self.env.num_envs):
            group = seeds[instance * agents:(instance + 1) * agents]
            if any(s != group[0] for s in group):
                raise ValueError(f"seed: the rows {instance * agents}..{(instance + 1) * agents - 1}"
                                 f" are agents of one instance and need one seed, got {group}")
            per_instance.append(group[0])
        return per_instance

    # ---- step ----------------------------------------------------------------------------
    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = _as_actions(self.env, actions)
        mode, ended_before = self.autoreset_mode, self._ended
        held = None
        if ended_before.any():
            if mode == AutoresetMode.DISABLED:
                rows = np.flatnonzero(ended_before).tolist()
                raise RuntimeError(f"sub-envs {rows} ended and autoreset is disabled: reset them "
                                   "with reset(options={'reset_mask': mask}) before stepping")
            if mode == AutoresetMode.NEXT_STEP:
                held_rows = np.flatnonzero(ended_before)
                held = np.zeros(self.env.num_envs, bool)
                held[held_rows // self.env.agents_per_env] = True
        if held is None:
            observations, rewards, terminals, truncations, _ = self.env.step(actions)
        else:
            observations, rewards, terminals, truncations, _ = self.env.step(actions, hold=held)
        ended = terminals | truncations
        infos = {}
        if mode == AutoresetMode.SAME_STEP:
            observations = self._out(observations)
            if ended.any():
                final = np.full(self.num_envs, None, dtype=object)
                for row in np.flatnonzero(ended):
                    final[row] = self.env.final_observations[row].copy()
                infos["final_obs"] = final
                infos["_final_obs"] = ended.copy()
                infos["final_info"] = {}
                infos["_final_info"] = ended.copy()
        else:
            observations = self._out(observations)
            if ended.any():  # the batch already reset them: show the episodes' last observations
                if observations is self.env.observations:
                    observations = observations.copy()
                rows = np.flatnonzero(ended)
                observations[rows] = self.env.final_observations[rows]
        if self._episodes is not None:
            self._episodes.record(rewards, ended, infos,
                                  restarted=held_rows if held is not None else None)
        self._ended = ended.copy() if mode != AutoresetMode.SAME_STEP else self._ended
        masks = self.env.masks
        if not masks.all():
            infos["masks"] = masks.copy()
        return (observations, self._out(rewards), self._out(terminals), self._out(truncations),
                infos)

    def _out(self, array):
        return array.copy() if self.copy else array

    # ---- the rest of the VectorEnv API ------------------------------------------------------
    def render(self) -> tuple[np.ndarray, ...] | None:
        return _frames(self.env, self._renderer)

    def get_attr(self, name: str) -> tuple:
        return tuple(_row_values(self, self.env, name, _rows(self.env, None)))

    def set_attr(self, name: str, values: Any) -> None:
        _set_batch_attr(self, self.env, name, values)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple | None:
        """Calls the batch's method `name` once (every row shares it); its result
        is repeated per sub-env. A non-callable attribute is read like get_attr."""
        if name == "render":
            return self.render()
        attribute = getattr(self.env, name, None) if hasattr(self.env, name) else \
            getattr(self, name)
        if not callable(attribute):
            return self.get_attr(name)
        return (attribute(*args, **kwargs),) * self.num_envs

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class GymnasiumEnv(IndependentCopies, Env):
    """One instance of a native env as a gymnasium.Env: gymnasium.make's entry point.

        env = gymnasium.make("peregrine/CartPole-v1")           # or GymnasiumEnv("cartpole")
        observation, info = env.reset(seed=0)
        observation, reward, terminated, truncated, info = env.step(env.action_space.sample())

    Spaces are the native env's single spaces (a Discrete action space keeps
    the batch's int32 dtype; any integer action in range is accepted). The
    episode ends at the env's own limit (its `max_steps` config field);
    `max_steps=None` lifts it (the field's maximum), which is how the ids with
    Gymnasium's rules are registered: there gymnasium.make's TimeLimit (the
    spec's max_episode_steps, or the one given) ends the episodes, as for
    Gymnasium's own envs. The batch resets an ended instance inside the step:
    reset() without a seed after an episode ended returns that already drawn
    start (stepping without reset() continues from it). Keyword arguments are
    the env's config fields (and preset=); any other keyword is a TypeError
    (UnknownKeywordError) as Python's own.

    render_mode "rgb_array" draws the instance (every env can);
    gymnasium.make(..., render_mode="human") shows those frames in a window
    through Gymnasium's HumanRendering wrapper (pygame). Copies and pickles
    are independent envs over a new batch in the same state.

    Multi-agent envs (drone_swarm with n_drones > 1) have no single-agent view:
    use gymnasium.make_vec (one sub-env per agent) or the PettingZoo export
    peregrine.envs.drone_swarm.parallel_env.
    """

    metadata = {"render_modes": ["rgb_array"]}  # every env draws; render_fps: see __init__

    def __init__(self, name: str, render_mode: str | None = None, **config: Any) -> None:
        cls = env_class(name)
        if "num_envs" in config:
            raise ValueError("gymnasium.make gives one env: gymnasium.make_vec(id, "
                             "num_envs=N) gives N")
        if "seed" in config:
            raise ValueError("gymnasium.make takes no seed: seed the env with reset(seed=S)")
        if "max_steps" in config and config["max_steps"] is None:
            config["max_steps"] = _field_maximum(cls, "max_steps")
        batch = cls(num_envs=1, seed=None, **config)
        if batch.agents_per_env != 1:
            batch.close()
            raise ValueError(f"{name} with {batch.agents_per_env} agents per env has no "
                             "single-agent gymnasium.Env view: use gymnasium.make_vec(id, "
                             "num_envs=N) with its default vectorization mode (one sub-env per "
                             "agent of N native instances; the 'sync' and 'async' modes are "
                             "built from single-agent envs), or peregrine.envs.registry."
                             f"parallel_env({name!r}) for PettingZoo")
        self.batch = batch
        try:
            self._renderer = _renderer(batch, render_mode)
        except (TypeError, ValueError):
            batch.close()
            raise
        self.render_mode = render_mode
        self.metadata = _render_metadata(batch)
        self.observation_space = batch.single_observation_space
        self.action_space = batch.single_action_space
        self._actions = np.zeros_like(batch.actions)
        self._start_drawn = False  # the batch reset the instance when its episode ended

    def reset(self, *, seed: int | None = None,
              options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}: Peregrine envs take no "
                             "reset options (configure the env when you make it)")
        if seed is not None or not self._start_drawn:
            self.batch.reset(seed=seed)
        self._start_drawn = False
        return self.batch.observations[0].copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._actions[0] = _as_actions(self.batch, action)[0]
        observations, rewards, terminals, truncations, _ = self.batch.step(self._actions)
        ended = bool(terminals[0] or truncations[0])
        self._start_drawn = ended
        observation = (self.batch.final_observations if ended else observations)[0].copy()
        return observation, float(rewards[0]), bool(terminals[0]), bool(truncations[0]), {}

    def render(self) -> np.ndarray | None:
        frames = _frames(self.batch, self._renderer)
        return None if frames is None else frames[0]

    def close(self) -> None:
        self.batch.close()


def _field_maximum(cls, field: str):
    """The largest value the C header allows for config field `field`."""
    for name, _default, _low, high, is_integer in cls.config_fields():
        if name == field:
            return int(high) if is_integer else high
    raise UnknownKeywordError(f"{cls.__name__}() got an unexpected keyword argument {field!r}")


def gymnasium_vector_env(name: str, num_envs: int = 1, num_threads: int = 1,
                         seed: int | None = None,
                         autoreset_mode: AutoresetMode | str | None = None,
                         record_episode_statistics: bool = False,
                         render_mode: str | None = None, max_episode_steps: int | None = None,
                         **config: Any) -> GymnasiumVectorEnv:
    """gymnasium.make_vec's entry point: a native batch of `num_envs` instances
    of env `name` behind GymnasiumVectorEnv (one sub-env per agent row).
    num_threads and the env's config fields (and preset=) go to the batch.
    The batch's max_steps is the `max_steps` given, else max_episode_steps
    (make_vec passes the spec's), else the env's default; `max_steps=None`
    (how the ids with Gymnasium's rules are registered) counts as not given."""
    if config.get("max_steps", None) is None:
        config.pop("max_steps", None)
        if max_episode_steps is not None:
            config["max_steps"] = max_episode_steps
    batch = env_class(name)(num_envs=num_envs, seed=seed, num_threads=num_threads, **config)
    try:
        return GymnasiumVectorEnv(batch, autoreset_mode=autoreset_mode,
                                  record_episode_statistics=record_episode_statistics,
                                  render_mode=render_mode)
    except Exception:
        batch.close()
        raise


# ---- Stable-Baselines3 ---------------------------------------------------------------------------

def sb3_vec_env(env: Any, render_mode: str | None = None) -> VecEnv:
    """An SB3 VecEnv over a Peregrine env (requires stable-baselines3).

    render_mode="rgb_array" (envs with a renderer) gives SB3's render() and
    get_images() one frame per row, each row showing its instance. metadata
    holds SB3's "render_modes" and, whatever the render_mode, the renderer's
    "render_fps" (SB3's VecVideoRecorder writes its videos at that rate)."""
    from stable_baselines3.common.vec_env import VecEnv

    if not all(hasattr(env, name) for name in ("num_agents", "single_observation_space",
                                               "single_action_space", "step", "reset")):
        raise TypeError(f"sb3_vec_env takes a Peregrine env (peregrine.make or "
                        f"peregrine.vector.make), got {type(env).__name__} {env!r}")
    renderer = _renderer(env, render_mode)

    class SB3VecEnv(VecEnv):
        """SB3's VecEnv interface: dones = terminals | truncations, the final
        observation in info["terminal_observation"], info["TimeLimit.truncated"]
        for bootstrapping, and info["episode"] (return, length) so SB3 logs
        episode statistics like its Monitor wrapper does.

        seed(s) then reset() reseeds the batch from s (SB3 derives s + i for
        env i; the batch derives every instance's stream from s, so s alone
        determines all rows). info["episode"] also holds the env's own
        statistics (see _EpisodeRecorder); its "t" is, as in SB3's Monitor,
        the seconds since the VecEnv was made."""

        def __init__(self, env):
            self.env = env
            self.render_mode = render_mode
            super().__init__(env.num_agents, env.single_observation_space,
                             env.single_action_space)
            # SB3's VecEnv sets metadata["render_modes"] (from render_mode) itself.
            fps = _renderer_fps(env)
            if fps is not None:
                self.metadata["render_fps"] = fps
            self._episodes = _EpisodeRecorder(env)
            self._start = time.perf_counter()
            self._actions = None

        def reset(self):
            seed = self._seeds[0]
            observations, _ = self.env.reset(seed=seed)
            self._reset_seeds()
            self._reset_options()
            self._episodes.restart()
            return observations.copy()

        def step_async(self, actions):
            self._actions = _as_actions(self.env, actions)

        def step_wait(self):
            observations, rewards, terminals, truncations, _ = self.env.step(self._actions)
            dones = terminals | truncations
            records = {}
            self._episodes.record(rewards, dones, records)
            # "TimeLimit.truncated" on every row, as SB3's DummyVecEnv writes it
            infos = [{"TimeLimit.truncated": cut}
                     for cut in (truncations & ~terminals).astype(bool).tolist()]
            for row in np.flatnonzero(dones):
                info = infos[row]
                info["terminal_observation"] = self.env.final_observations[row].copy()
                episode = {key: values[row].item() for key, values in records["episode"].items()}
                episode["t"] = round(time.perf_counter() - self._start, 6)
                info["episode"] = episode
            return observations.copy(), rewards.copy(), dones, infos

        def close(self):
            self.env.close()

        def get_attr(self, attr_name, indices=None):
            return _row_values(self, self.env, attr_name, _rows(self.env, indices))

        def set_attr(self, attr_name, value, indices=None):
            _whole_batch(self.env, _rows(self.env, indices), f"set_attr({attr_name!r})")
            _set_batch_attr(self, self.env, attr_name, value)

        def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
            rows = _rows(self.env, indices)
            _whole_batch(self.env, rows, f"env_method({method_name!r})")
            result = getattr(self.env, method_name)(*method_args, **method_kwargs)
            return [result] * len(rows)

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(_rows(self.env, indices))

        def get_images(self):
            frames = _frames(self.env, renderer)
            return [None] * self.num_envs if frames is None else list(frames)

    return SB3VecEnv(env)
