"""check_env: the native env contract, checked on any batch (as Gymnasium ships check_env).

    from peregrine.envs import check_env
    check_env("cartpole")          # a registered env: builds the batches it needs
    check_env(my_batch)            # a batch object with the native interface

Raises `EnvContractError` (a ValueError) naming the broken rule; returns None when
every rule holds. The rules are the ones `envs/native/pg_env.h` and docs/environments.md's
"env contract" state:

* spaces and buffers agree (shapes, dtypes, one row per agent, masks set);
* `step` returns the env's own buffers, updated in place, finite numbers, and a row
  is never terminal and truncated at once;
* the same seed gives bit-identical results (final observations and episode
  statistics included), `reset(seed=...)` restarts the streams, another seed gives
  other episodes, and the instances of a batch do not replay one stream; for a
  registered env or a NativeEnv also a fresh batch made with that seed, and fresh
  batches of 37 instances (three thread blocks) at 1, 2 and 5 threads;
* bad actions are refused with a ValueError that names the problem and change
  nothing: a wrong dtype ("dtype"), shape ("shape"), a list, a strided array
  ("contiguous"), discrete values out of range in the first or last row ("row N ...
  out of range"); NaN, inf and +-1e30 continuous actions keep everything finite;
* `instance_stats` splits `episode_stats` by instance (stepped until an episode
  ends, within a bound), and reading the aggregate with clear=True clears both;
* `get_state`/`set_state` round-trip, where the batch has them;
* for a registered env or a NativeEnv, a batch on buffers of the check's own (each
  followed by a guard of known bytes, observations first filled with NaN) writes every
  observation column at reset, nothing past any buffer's end (an obs_dim smaller than
  what a row gets, or rows outside [start, end)), and a final observation for every row
  that ended, over as many steps as episodes take to end (within a bound).

The test suite runs it on every registered env (tests/test_env_contract.py); write a
new env, then run it before anything else.
"""
from __future__ import annotations

from typing import Any

import numpy as np

STEPS = 120
NUM_ENVS = 7
# The C loop hands threads whole blocks of 16 instances (PG_RANGE_ALIGN in
# native/binding.h): a batch of one block runs on one thread whatever num_threads
# says, so the thread-count check uses three blocks, the last one partial.
THREAD_CHECK_ENVS = 37
THREAD_COUNTS = (1, 2, 5)   # one thread, fewer threads than blocks, more than blocks
# Steps the statistics check takes at most while waiting for an episode to end.
STATS_MAX_STEPS = 5000
HOSTILE_FLOATS = (np.nan, np.inf, -np.inf, 1e30, -1e30)


class EnvContractError(ValueError):
    """An env batch broke a rule of the native env contract."""


def _require(condition, rule: str) -> None:
    if not condition:
        raise EnvContractError(rule)


def _actions(env, count: int, seed: int) -> list[np.ndarray]:
    env.action_space.seed(seed)
    return [np.ascontiguousarray(env.action_space.sample()) for _ in range(count)]


def _trace(env, actions) -> list[np.ndarray]:
    """Everything a step writes, for each step; then the statistics of the episodes
    that ended in these steps (statistics outlive resets, so earlier ones are cleared)."""
    rows = []
    final = env.final_observations     # required (checked before any trace is taken)
    if hasattr(env, "episode_stats"):
        env.episode_stats(clear=True)
    for batch in actions:
        obs, rewards, terminals, truncations, _ = env.step(batch)
        rows += [obs.copy(), rewards.copy(), terminals.copy(), truncations.copy(), final.copy()]
    if hasattr(env, "episode_stats"):
        stats = env.episode_stats()
        rows.append(np.array([stats.count, *stats.mean.values(), *stats.std.values()]))
    return rows


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def check_env(env: str | Any, steps: int = STEPS) -> None:
    """Checks a registered env (by name) or a batch against the contract."""
    factory = _factory(env)
    if factory is not None:     # first: a row overrun lands in the check's own guards
        _check_writes(_env_class(env), getattr(env, "config", {}), factory)
    batch = factory(NUM_ENVS, 0, 1) if isinstance(env, str) else env
    try:
        _check_spaces_and_step(batch)
        _check_seeding(batch, factory, steps)
        _check_bad_actions(batch)
        _check_non_finite_actions(batch)
        _check_statistics(batch)
        _check_state(batch)
    finally:
        if batch is not env:
            batch.close()


def _factory(env):
    """(num_envs, seed, num_threads, **make's keywords such as buffers=) -> a fresh
    batch like `env`, or None."""
    from .registry import make
    from .native.batch import NativeEnv
    if isinstance(env, str):
        return lambda num_envs, seed, threads, **more: make(
            env, num_envs=num_envs, seed=seed, num_threads=threads, **more)
    if isinstance(env, NativeEnv):
        return lambda num_envs, seed, threads, **more: type(env)(
            num_envs=num_envs, seed=seed, num_threads=threads, **env.config, **more)
    return None


def _check_spaces_and_step(env) -> None:
    rows = env.num_agents
    _require(env.observation_space.shape == (rows, *env.single_observation_space.shape),
             "observation_space must batch single_observation_space over num_agents rows")
    _require(env.observations.shape == env.observation_space.shape
             and env.observations.dtype == env.single_observation_space.dtype,
             "observations must have observation_space's shape and dtype")
    _require(env.final_observations.shape == env.observations.shape,
             "final_observations must have the observations' shape")
    _require(env.actions.shape == env.action_space.shape
             and env.actions.dtype == env.single_action_space.dtype,
             "actions must have action_space's shape and dtype")
    for name in ("rewards", "terminals", "truncations"):
        _require(getattr(env, name).shape == (rows,), f"{name} must hold one entry per row")
    masks = getattr(env, "masks", None)
    _require(masks is None or (masks.shape == (rows,) and masks.any()),
             "masks must hold one entry per row, live rows True")
    _require({"episode_return", "episode_length"} <= set(env.stat_names),
             "stat_names must include episode_return and episode_length")
    for actions in _actions(env, 30, seed=1):
        obs, rewards, terminals, truncations, infos = env.step(actions)
        _require(obs is env.observations and rewards is env.rewards
                 and terminals is env.terminals and truncations is env.truncations,
                 "step must return the env's own buffers, updated in place")
        _require(isinstance(infos, dict), "step must return a dict of infos")
        _require(np.isfinite(obs).all() and np.isfinite(rewards).all(),
                 "observations and rewards must be finite")
        _require(not (terminals & truncations).any(),
                 "a row must not be terminal and truncated at once")


def _check_seeding(env, factory, steps: int) -> None:
    actions = _actions(env, steps, seed=2)
    env.reset(seed=5)
    first = _trace(env, actions)
    env.reset(seed=5)
    _require(_same(first, _trace(env, actions)),
             "reset(seed=s) must restart the random streams: the same seed and actions "
             "must repeat the same results")
    seeded = {}
    for seed in (6, 5):
        env.reset(seed=seed)
        seeded[seed] = [env.step(batch)[0].copy() for batch in actions]
    _require(not _same(seeded[5], seeded[6]), "another seed must give other episodes")
    if env.num_agents > 1:
        _require(any(not np.array_equal(obs[0], obs[-1]) for obs in seeded[5]),
                 "the instances of a batch must have their own random streams, not "
                 "replay one")
    if factory is None:
        return
    twin = factory(env.num_envs, 5, 1)
    try:
        _require(_same(first, _trace(twin, actions)),
                 "a batch made with seed s must play as one reset with seed s")
    finally:
        twin.close()
    traces = []
    for threads in THREAD_COUNTS:
        twin = factory(THREAD_CHECK_ENVS, 5, threads)
        try:
            traces.append(_trace(twin, _actions(twin, steps, seed=6)))
        finally:
            twin.close()
    _require(all(_same(traces[0], trace) for trace in traces[1:]),
             "the same seed must give bit-identical results for any num_threads")


def _refuses(env, actions, what: str, names: str, before) -> None:
    """`step(actions)` must raise a ValueError whose message has `names` in it and
    leave the observations as they were."""
    try:
        env.step(actions)
    except ValueError as error:
        _require(names.lower() in str(error).lower(),
                 f"step's error for {what} must name the problem ({names!r}), got: {error}")
    else:
        raise EnvContractError(f"step must refuse {what} with a ValueError")
    _require(np.array_equal(env.observations, before),
             f"a refused step ({what}) must not change the env")


def _check_bad_actions(env) -> None:
    good = _actions(env, 1, seed=3)[0]
    before = env.observations.copy()
    other = np.float64 if good.dtype == np.float32 else np.int64
    _refuses(env, good.astype(other), "a wrong dtype", "dtype", before)
    _refuses(env, good[:-1], "a wrong shape", "shape", before)
    _refuses(env, good.tolist(), "a list", "", before)
    _refuses(env, np.repeat(good, 2, axis=0)[::2], "a strided array", "contiguous", before)
    if good.dtype != np.int32:
        return
    space = env.single_action_space
    high = np.asarray(getattr(space, "nvec", getattr(space, "n", 0))).max()
    for row in (0, good.shape[0] - 1):
        for value, what in ((high, "too large"), (-1, "negative")):
            bad = good.copy()
            bad.reshape(good.shape[0], -1)[row] = value
            _refuses(env, bad, f"a discrete action {what} in row {row}", f"row {row}", before)
            _refuses(env, bad, f"a discrete action {what} in row {row}", "out of range", before)


def _check_non_finite_actions(env) -> None:
    if env.actions.dtype != np.float32:
        return
    for value in HOSTILE_FLOATS:
        for _ in range(30):
            obs, rewards, *_ = env.step(np.full(env.actions.shape, value, np.float32))
            _require(np.isfinite(obs).all() and np.isfinite(rewards).all(),
                     f"continuous actions of {value} must keep observations and rewards "
                     f"finite")


def _check_statistics(env) -> None:
    if not hasattr(env, "instance_stats"):
        return
    env.episode_stats(clear=True)
    actions = _actions(env, 100, seed=4)
    for step in range(STATS_MAX_STEPS):
        env.step(actions[step % len(actions)])
        if step % 100 == 99 and np.sum(env.instance_stats(clear=False)[0]) > 0:
            break
    episodes, sums = env.instance_stats(clear=False)
    _require(np.shape(episodes) == (env.num_envs,)
             and np.shape(sums) == (env.num_envs, len(env.stat_names)),
             "instance_stats must return (episodes per instance, sums per instance and "
             "statistic)")
    aggregate = env.episode_stats(clear=True)
    _require(int(np.sum(episodes)) == aggregate.count,
             "instance_stats must count the episodes episode_stats counts")
    if aggregate.count:
        for column, name in enumerate(env.stat_names):
            mean = float(np.sum(sums[:, column])) / aggregate.count
            _require(np.isclose(mean, aggregate.mean[name], rtol=1e-9, atol=1e-9),
                     f"instance_stats sums of {name} must average to episode_stats' mean")
    _require(int(np.sum(env.instance_stats()[0])) == 0,
             "episode_stats(clear=True) must clear the per-instance statistics too")


def _check_state(env) -> None:
    if not (hasattr(env, "get_state") and hasattr(env, "set_state")):
        return
    state = np.asarray(env.get_state(0))
    env.set_state(env.num_envs - 1, state)
    _require(np.array_equal(np.asarray(env.get_state(env.num_envs - 1)), state),
             "set_state then get_state must return the same state")


GUARD_BYTES = 256       # known bytes after each buffer of the write check
GUARD_BYTE = 0xA5


def _env_class(env):
    from .native.batch import NativeEnv
    from .registry import env_class
    return type(env) if isinstance(env, NativeEnv) else env_class(env)


def _guarded_buffers(layout) -> tuple[dict, dict]:
    """Buffers of `layout` (name -> (shape, dtype)), each the head of a larger array
    whose tail (the guard) holds GUARD_BYTE; float observation buffers start as NaN
    (unwritten)."""
    buffers, guards = {}, {}
    for name, (shape, dtype) in layout.items():
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        storage = np.full(size + GUARD_BYTES, GUARD_BYTE, np.uint8)
        array = storage[:size].view(dtype).reshape(shape)
        if name in ("observations", "final_observations") and dtype.kind == "f":
            array[...] = np.nan
        buffers[name], guards[name] = array, storage[size:]
    return buffers, guards


def _check_writes(cls, config: dict, factory) -> None:
    buffers, guards = _guarded_buffers(cls.buffer_layout(NUM_ENVS, **config))

    def guards_intact(when: str) -> None:
        for name, guard in guards.items():
            _require((guard == GUARD_BYTE).all(),
                     f"{when} wrote past the end of the {name} buffer: an observation row "
                     f"longer than obs_dim (obs_dim must count every value a row gets), or "
                     f"rows outside the instances [start, end) it was given")
    # Made on the check's buffers; the make fills every row (its reset) before returning.
    twin = factory(NUM_ENVS, 7, 1, buffers=buffers)
    try:
        guards_intact("reset")
        floats = twin.observations.dtype.kind == "f"
        if floats:
            unwritten = np.argwhere(np.isnan(twin.observations))
            if unwritten.size:
                row, column = unwritten[0]
                raise EnvContractError(
                    f"reset left observations unwritten (row {row}, column {column} is "
                    f"still the NaN the check's buffer started as): obs_dim must count only "
                    f"the values env_reset and env_step write to a row")
        actions = _actions(twin, 50, seed=8)
        for step in range(STATS_MAX_STEPS):
            if floats:
                twin.final_observations[...] = np.nan
            _, _, terminals, truncations, _ = twin.step(actions[step % len(actions)])
            guards_intact("step")
            _require(not (terminals & truncations).any(),
                     "a row must not be terminal and truncated at once")
            ended = terminals | truncations
            if floats and ended.any():
                _require(not np.isnan(twin.final_observations[ended]).any(),
                         "a row that ended must have its final observation written into "
                         "final_observations (the observation it ended on) before the "
                         "instance resets")
            if step >= 200 and ended.any():
                break
    finally:
        twin.close()
