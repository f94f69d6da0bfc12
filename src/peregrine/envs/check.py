"""check_env: the native env contract, checked on any batch (as Gymnasium ships check_env).

    from peregrine.envs import check_env
    check_env("cartpole")          # a registered env: builds the batches it needs
    check_env(my_batch)            # a batch object with the native interface

Raises `EnvContractError` (a ValueError) naming the broken rule; returns None when
every rule holds. The rules are the ones `envs/native/pg_env.h` and the README's
"env contract" state:

* spaces and buffers agree (shapes, dtypes, one row per agent, masks set);
* `step` returns the env's own buffers, updated in place, finite numbers, and a row
  is never terminal and truncated at once;
* the same seed gives bit-identical results, and `reset(seed=...)` restarts the
  streams; for a registered env or a NativeEnv also a fresh batch made with that seed,
  and fresh batches of 37 instances (three thread blocks) at 1 and 3 threads;
* bad actions (wrong dtype, shape, a list, out-of-range discrete values) are refused
  with a ValueError and change nothing; NaN/inf continuous actions keep everything
  finite;
* `instance_stats` splits `episode_stats` by instance;
* `get_state`/`set_state` round-trip, where the batch has them.

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


class EnvContractError(ValueError):
    """An env batch broke a rule of the native env contract."""


def _require(condition, rule: str) -> None:
    if not condition:
        raise EnvContractError(rule)


def _actions(env, count: int, seed: int) -> list[np.ndarray]:
    env.action_space.seed(seed)
    return [np.ascontiguousarray(env.action_space.sample()) for _ in range(count)]


def _trace(env, actions) -> list[np.ndarray]:
    rows = []
    for batch in actions:
        obs, rewards, terminals, truncations, _ = env.step(batch)
        rows += [obs.copy(), rewards.copy(), terminals.copy(), truncations.copy()]
    return rows


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def check_env(env: str | Any, steps: int = STEPS) -> None:
    """Checks a registered env (by name) or a batch against the contract."""
    factory = _factory(env)
    batch = factory(NUM_ENVS, 0, 1) if isinstance(env, str) else env
    try:
        _check_spaces_and_step(batch)
        _check_seeding(batch, factory, steps)
        _check_bad_actions(batch)
        _check_statistics(batch, steps)
        _check_state(batch)
    finally:
        if batch is not env:
            batch.close()


def _factory(env):
    """(num_envs, seed, num_threads) -> a fresh batch like `env`, or None."""
    from ..registry import make
    from .native_env import NativeEnv
    if isinstance(env, str):
        return lambda num_envs, seed, threads: make(env, num_envs=num_envs, seed=seed,
                                                    num_threads=threads)
    if isinstance(env, NativeEnv):
        return lambda num_envs, seed, threads: type(env)(num_envs=num_envs, seed=seed,
                                                         num_threads=threads, **env.config)
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
    if factory is None:
        return
    twin = factory(env.num_envs, 5, 1)
    try:
        _require(_same(first, _trace(twin, actions)),
                 "a batch made with seed s must play as one reset with seed s")
    finally:
        twin.close()
    traces = []
    for threads in (1, 3):
        twin = factory(THREAD_CHECK_ENVS, 5, threads)
        try:
            traces.append(_trace(twin, _actions(twin, steps, seed=6)))
        finally:
            twin.close()
    _require(_same(traces[0], traces[1]),
             "the same seed must give bit-identical results for any num_threads")


def _check_bad_actions(env) -> None:
    good = _actions(env, 1, seed=3)[0]
    before = env.observations.copy()
    other = np.float64 if good.dtype == np.float32 else np.int64
    wrong = {"a wrong dtype": good.astype(other), "a wrong shape": good[:-1],
             "a list": good.tolist()}
    if good.dtype == np.int32:
        space = env.single_action_space
        high = np.asarray(getattr(space, "nvec", getattr(space, "n", 0))).max()
        too_big = good.copy()
        too_big.reshape(good.shape[0], -1)[-1] = high
        wrong["an out-of-range discrete action"] = too_big
    for what, actions in wrong.items():
        try:
            env.step(actions)
        except ValueError:
            pass
        else:
            raise EnvContractError(f"step must refuse {what} with a ValueError")
        _require(np.array_equal(env.observations, before),
                 f"a refused step ({what}) must not change the env")
    if good.dtype == np.float32:
        for value in (np.nan, np.inf, -np.inf):
            obs, rewards, *_ = env.step(np.full(good.shape, value, np.float32))
            _require(np.isfinite(obs).all() and np.isfinite(rewards).all(),
                     "NaN/inf continuous actions must keep observations and rewards finite")


def _check_statistics(env, steps: int) -> None:
    if not hasattr(env, "instance_stats"):
        return
    env.episode_stats(clear=True)
    for actions in _actions(env, steps, seed=4):
        env.step(actions)
    episodes, sums = env.instance_stats(clear=False)
    aggregate = env.episode_stats(clear=True)
    _require(int(np.sum(episodes)) == aggregate.count,
             "instance_stats must count the episodes episode_stats counts")
    if aggregate.count:
        for column, name in enumerate(env.stat_names):
            mean = float(np.sum(sums[:, column])) / aggregate.count
            _require(np.isclose(mean, aggregate.mean[name], rtol=1e-9, atol=1e-9),
                     f"instance_stats sums of {name} must average to episode_stats' mean")


def _check_state(env) -> None:
    if not (hasattr(env, "get_state") and hasattr(env, "set_state")):
        return
    state = np.asarray(env.get_state(0))
    env.set_state(env.num_envs - 1, state)
    _require(np.array_equal(np.asarray(env.get_state(env.num_envs - 1)), state),
             "set_state then get_state must return the same state")
