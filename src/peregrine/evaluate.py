"""Evaluation: complete episodes of a policy on a native batch, as episode statistics.

    from peregrine.evaluate import evaluate
    result = evaluate("drone_swarm", "lawnmower", episodes=64, seed=0)
    result["mean"]["delivered"], result["std"]["delivered"]

`policy` is one of:
- a scripted policy name: "random" for any env (uniform over its action
  space), plus the env's own baselines (`SCRIPTED`, e.g. drone_swarm's
  "lawnmower" and "voronoi");
- a checkpoint path (file or run directory), loaded with
  `peregrine.train.checkpoint.load_actor(path, env)`;
- a policy object: callable(observations) -> actions, optionally with
  `reset(env)` and `observe_done(terminals, truncations)`.

How episodes are counted, so that the statistics are unbiased and their count
is exactly `episodes`: every instance of a batch contributes only its first
episode (a batch that took "the first N episodes to finish" would favour
short ones). The statistics of the episodes that end in a step are read from
the C aggregate after that step (`episode_stats(clear=True)`); an instance
that already finished keeps running (the batch steps every instance) and its
later episodes are discarded. For envs that have one (`HOLD_ACTIONS`), such
instances get a "hold" action that keeps their next episode from ending early
(drone_swarm: hover without scanning, so nothing is delivered and, unless the
idle drain empties every battery first, the episode runs to max_steps), so a
later episode does not end in the same step as a first one. If that still happens (other envs), the aggregate of that step
cannot be split: for single-agent envs whose statistics are just
episode_return and episode_length, the first episodes are attributed from the
rewards summed here; otherwise they are dropped and replaced by further rounds
on fresh instances (a small bias towards episodes that end apart from others,
which no registered env with scripted baselines hits). Round r > 0 uses seed + r * 1_000_003, and each
round's batch has as many instances as episodes are still needed (at most
`num_envs`), so which episodes are counted never depends on their outcome.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .registry import list_envs, make

#: env name -> module holding `POLICIES` (name -> class(seed=...)) of scripted policies
SCRIPTED = {
    "drone_swarm": "peregrine.envs.drone_swarm.baselines",
    "prospector": "peregrine.envs.prospector.scripted",
}

#: env name -> function(env) -> actions for instances whose counted episode is over
HOLD_ACTIONS = {
    "drone_swarm": lambda env: np.zeros(env.action_space.shape, env.action_space.dtype),
}

ROUND_SEED_STRIDE = 1_000_003
MAX_ROUNDS = 20  # rounds beyond ceil(episodes / num_envs), for replacements
DEFAULT_MAX_EPISODE_STEPS = 100_000


class RandomPolicy:
    """Uniform samples of the env's action space (seeded); works for every env."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def reset(self, env) -> None:
        self.space = env.action_space
        self.space.seed(self.seed)

    def __call__(self, observations):
        return self.space.sample()


def scripted_policy_names(env_name: str) -> list[str]:
    """Names accepted as `policy` for this env (besides checkpoint paths)."""
    names = {"random"}
    if env_name in SCRIPTED:
        import importlib
        names |= set(importlib.import_module(SCRIPTED[env_name]).POLICIES)
    return sorted(names)


def make_policy(env_name: str, policy, env, seed: int = 0):
    """Resolves `policy` (name, checkpoint path or object) to an object bound to `env`."""
    if not isinstance(policy, (str, os.PathLike)):
        if not callable(policy):
            raise ValueError(f"policy must be a scripted policy name, a checkpoint path or a "
                             f"callable, got {type(policy).__name__}")
        if hasattr(policy, "reset"):
            _reset(policy, env)
        return policy
    text = os.fspath(policy)
    names = scripted_policy_names(env_name)
    if text in names:
        if env_name in SCRIPTED:
            import importlib
            classes = importlib.import_module(SCRIPTED[env_name]).POLICIES
            if text in classes:
                scripted = classes[text](seed=seed)
                scripted.reset(env)
                return scripted
        scripted = RandomPolicy(seed=seed)
        scripted.reset(env)
        return scripted
    if not os.path.exists(text):
        raise ValueError(f"unknown policy {text!r} for {env_name}: not a scripted policy "
                         f"({', '.join(names)}) and no checkpoint file or run directory "
                         f"exists at that path")
    return load_checkpoint_policy(text, env)


def load_checkpoint_policy(path: str, env):
    """The deterministic actor of a checkpoint; ValueError with the reason if it cannot load."""
    try:
        from .train.checkpoint import load_actor
    except ImportError as error:
        raise ValueError(f"cannot load checkpoint {path!r}: the trainer "
                         f"(peregrine.train.checkpoint.load_actor, needs torch) is not "
                         f"available: {error}") from None
    try:
        actor = load_actor(path, env)
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - any decoding failure is a bad file
        raise ValueError(f"cannot load checkpoint {path!r}: {type(error).__name__}: {error}") from None
    if hasattr(actor, "reset"):
        actor.reset()
    return actor


def _reset(policy, env) -> None:
    try:
        policy.reset(env)
    except TypeError:
        policy.reset()


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def evaluate(env_name: str, policy: Any, episodes: int = 64, seed: int = 0, preset: str = "default",
             num_envs: int | None = None, num_threads: int = 1, **config) -> dict:
    """Runs `episodes` complete episodes and returns their statistics.

    Returns {"env", "policy", "episodes": n, "mean": {stat: v}, "std": {stat: v}}
    where std is the population standard deviation over the n episodes.
    `num_envs` caps the instances stepped at once (default: min(episodes, 1024)).
    """
    if env_name not in list_envs():
        raise ValueError(f"unknown env {env_name!r}; available: {list_envs()}")
    episodes = _check_positive("episodes", episodes)
    num_envs = min(episodes, 1024) if num_envs is None else _check_positive("num_envs", num_envs)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")

    count, sums, squares, names = 0, None, None, None
    bound = None
    rounds = -(-episodes // num_envs) + MAX_ROUNDS  # MAX_ROUNDS extra for replacements
    for round_index in range(rounds):
        needed = episodes - count
        if needed <= 0:
            break
        round_seed = int(seed) + round_index * ROUND_SEED_STRIDE
        env = make(env_name, num_envs=min(num_envs, needed), seed=round_seed,
                   num_threads=num_threads, preset=preset, **config)
        try:
            if bound is None:
                bound = make_policy(env_name, policy, env, seed=int(seed))
            elif hasattr(bound, "reset"):
                if isinstance(getattr(bound, "seed", None), int):
                    bound.seed = int(seed) + round_index  # fresh random actions per round
                _reset(bound, env)
            names = list(env.stat_names)
            got, got_sums, got_squares = _first_episodes(env_name, env, bound, round_seed)
        finally:
            env.close()
        count += got
        sums = got_sums if sums is None else sums + got_sums
        squares = got_squares if squares is None else squares + got_squares
    if count < episodes:
        raise RuntimeError(f"only {count} of {episodes} episodes could be counted after "
                           f"{rounds} rounds (episodes ending in the same step as discarded ones)")
    mean = sums / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    label = os.fspath(policy) if isinstance(policy, (str, os.PathLike)) else type(policy).__name__
    return {
        "env": env_name,
        "policy": label,
        "preset": preset,
        "seed": int(seed),
        "episodes": count,
        "mean": {n: float(v) for n, v in zip(names, mean)},
        "std": {n: float(v) for n, v in zip(names, std)},
    }


def _first_episodes(env_name: str, env, policy, seed: int):
    """Steps `env` until every instance finished its first episode.

    Returns (count, sums, squares) over the first episodes that could be
    attributed (see the module docstring).
    """
    instances, agents = env.num_envs, env.agents_per_env
    names = list(env.stat_names)
    sums = np.zeros(len(names))
    squares = np.zeros(len(names))
    count = 0
    finished = np.zeros(instances, bool)
    hold = HOLD_ACTIONS.get(env_name)
    hold_actions = hold(env) if hold else None
    max_steps = int(env.config.get("max_steps", DEFAULT_MAX_EPISODE_STEPS))
    # Returns and lengths kept here too: when a first and a later episode end in
    # the same step, these attribute the first ones for envs whose statistics
    # are just these two (one agent per instance).
    own_stats = agents == 1 and set(names) <= {"episode_return", "episode_length"}
    returns = np.zeros(instances)
    lengths = np.zeros(instances)
    observations, _ = env.reset(seed=seed)
    env.episode_stats(clear=True)
    observe_done = getattr(policy, "observe_done", None)
    for _ in range(max_steps + 1):
        actions = np.ascontiguousarray(policy(observations), dtype=env.action_space.dtype)
        if actions.shape != env.action_space.shape:
            if actions.size != int(np.prod(env.action_space.shape)):
                raise ValueError(f"the policy returned actions of shape {actions.shape}; "
                                 f"{env_name} with {instances} instances needs {env.action_space.shape}")
            actions = actions.reshape(env.action_space.shape)
        if hold_actions is not None and finished.any():
            rows = np.repeat(finished, agents)
            actions = actions.copy()
            actions[rows] = hold_actions[rows]
        observations, rewards, terminals, truncations, _ = env.step(actions)
        if observe_done is not None:
            observe_done(terminals, truncations)
        if own_stats:
            returns += rewards
            lengths += 1
        ended = (terminals | truncations).reshape(instances, agents).any(1)
        if not ended.any():
            continue
        stats = env.episode_stats(clear=True)
        first = ended & ~finished
        later = ended & finished
        if first.any() and not later.any():
            n = stats.count
            mean = np.array([stats.mean[k] for k in names])
            std = np.array([stats.std[k] for k in names])
            count += n
            sums += mean * n
            squares += (std * std + mean * mean) * n
        elif first.any() and own_stats:
            values = {"episode_return": returns[first], "episode_length": lengths[first]}
            table = np.stack([values[k] for k in names], axis=1)
            count += int(first.sum())
            sums += table.sum(0)
            squares += (table * table).sum(0)
        if own_stats:
            returns[ended] = 0.0
            lengths[ended] = 0.0
        finished |= ended
        if finished.all():
            return count, sums, squares
    raise RuntimeError(f"{env_name}: episodes did not end within {max_steps + 1} steps")
