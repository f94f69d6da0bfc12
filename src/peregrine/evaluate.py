"""Evaluation: complete episodes of a policy on a native batch, as episode statistics.

    from peregrine.evaluate import evaluate
    result = evaluate("drone_swarm", "lawnmower", episodes=64, seed=0)
    result["mean"]["delivered"], result["std"]["delivered"]

`policy` is anything `peregrine.policies.make_policy` resolves: a scripted
policy name ("random", or one of the env's baselines such as drone_swarm's
"lawnmower"), a checkpoint path, or a policy object (callable(observations) ->
actions, optionally with `reset(env)` and `observe_done(terminals, truncations)`).

The world (env config) an evaluation runs in: a checkpoint is evaluated in the
world it was trained in (its [env] section: preset and config fields, rewards
included) unless `preset` is given; any other policy in the "default" preset.
Config fields passed as keywords override either. `eval_world` resolves this
once for `evaluate`, `peregrine eval` and `peregrine render`; the result says
which world ran ("world"). With `preset`, a checkpoint keeps its env class's
`agent_fields` (observation columns that belong to the agent, such as
DroneSwarm's `obs_report`), so its policy can still read the observations.

How episodes are counted, so that the statistics are unbiased and their count
is exactly `episodes`: every instance of a batch contributes only its first
episode (a batch that took "the first N episodes to finish" would favour
short ones). The C batch keeps one statistics row per instance; after a step
in which episodes ended, the rows of instances finishing their first episode
hold exactly that episode (`env.instance_stats()`), and later episodes of
instances already counted are ignored. Round r > 0 uses seed + r * 1_000_003 (modulo
2**64), and each round's batch has as many instances as episodes are still needed (at
most `num_envs`), so which episodes are counted never depends on their outcome.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .envs.registry import list_envs, make
from .envs.native import protocols
from .envs.scripted import reset_policy, scripted_policy_names  # noqa: F401 (scripted_policy_names re-exported)
from .policies import make_policy
from .train.world import world_of
from .vector.export import check_integer_actions

ROUND_SEED_STRIDE = 1_000_003
DEFAULT_MAX_EPISODE_STEPS = 100_000


def is_checkpoint(env_name: str, policy) -> bool:
    """True when `policy` names a checkpoint file or run directory (not a scripted name)."""
    return (isinstance(policy, (str, os.PathLike)) and os.fspath(policy) not in
            scripted_policy_names(env_name) and os.path.exists(os.fspath(policy)))


def eval_world(env_name: str, policy, preset: str | None = None, overrides: dict | None = None) -> dict:
    """The env keywords an evaluation of `policy` runs with, and where they come from.

    Returns {"kwargs": keywords for `make` (preset and fields), "description":
    one line for output headers, "explicit": whether the caller chose the world}.
    A checkpoint's own world is the default; `preset` replaces it (keeping the
    checkpoint's agent fields); `overrides` (config fields) apply on top.
    """
    trained = _checkpoint_world(env_name, policy) if is_checkpoint(env_name, policy) else None
    return world_of(env_name, trained, preset, overrides)


def _checkpoint_world(env_name: str, policy) -> tuple:
    """(env name, env keywords) a checkpoint was trained with."""
    try:
        from .train.checkpoint import env_kwargs
    except ImportError as error:
        raise ValueError(f"cannot read checkpoint {os.fspath(policy)!r}: the trainer "
                         f"(needs torch) is not available: {error}") from None
    trained_name, trained = env_kwargs(policy)
    if env_name is not None and trained_name is not None and trained_name != env_name:
        raise ValueError(f"checkpoint {os.fspath(policy)!r} was trained on {trained_name!r}, "
                         f"not {env_name!r}")
    return trained_name, trained


def _check_positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def evaluate(env_name: str | Callable | None, policy: Any, episodes: int = 64, seed: int = 0,
             preset: str | None = None, num_envs: int | None = None, num_threads: int = 1,
             sample: bool = False, **config) -> dict:
    """Runs `episodes` complete episodes and returns their statistics.

    `env_name`: any name `peregrine train` takes, None for a checkpoint's own env, or
    a Python callable that makes the env (as `load_config` takes one; the only way
    back to an env trained from a lambda or closure).

    Returns {"env", "policy", "preset", "world", "env_config", "episodes": n,
    "mean": {stat: v}, "std": {stat: v}} where std is the population standard
    deviation over the n episodes, "world" describes where the env config came
    from (see `eval_world`) and "env_config" is the resolved config.
    `num_envs` caps the instances stepped at once (default: min(episodes, 1024)).
    `sample`: a checkpoint's policy samples its actions (seeded by `seed`) instead of
    taking the mode ("actions" in the result says which).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if env_name is None:
        env_name = checkpoint_env_name(policy)
    if callable(env_name) or env_name not in list_envs():
        from .vector.sources import kind_of
        if not callable(env_name):
            kind_of(env_name)       # an unknown name: the kinds of names listed
        if preset is not None:
            raise ValueError("a preset applies to native envs; an emulated env takes its "
                             "make's keywords (--env.KEY VALUE)")
        return evaluate_emulated(env_name, policy, episodes, seed, num_envs, sample, **config)
    episodes = _check_positive("episodes", episodes)
    num_envs = min(episodes, 1024) if num_envs is None else _check_positive("num_envs", num_envs)

    world = eval_world(env_name, policy, preset, config)
    bound_to = {}

    def bind(env):
        bound_to["env_config"] = protocols.env_config(env)
        return make_policy(env_name, policy, env, seed=int(seed),
                           check_world=not world["explicit"], sample=sample)

    count, names, mean, std = _run_rounds(
        episodes, num_envs, seed,
        lambda instances, round_seed: make(env_name, num_envs=instances, seed=round_seed,
                                           num_threads=num_threads, **world["kwargs"]),
        bind, lambda env, bound, round_seed, _instances: _first_episodes(env_name, env, bound, round_seed))
    env_config = bound_to["env_config"]
    label = _label(policy)
    return {
        "env": env_name,
        "policy": label,
        "preset": world["kwargs"].get("preset", "default"),
        "world": world["description"],
        "env_config": env_config,
        "seed": int(seed),
        "actions": "sampled" if sample else "mode",
        "episodes": count,
        "mean": {n: float(v) for n, v in zip(names, mean)},
        "std": {n: float(v) for n, v in zip(names, std)},
    }


def checkpoint_env_name(policy) -> str:
    """The env a checkpoint (file or run directory) was trained on: what `eval` and
    `render` use when no env is named."""
    if not (isinstance(policy, (str, os.PathLike)) and os.path.exists(os.fspath(policy))):
        path = os.fspath(policy) if isinstance(policy, (str, os.PathLike)) else ""
        if path and (os.sep in path or path.endswith(".pt")):     # a path, not a policy name
            raise ValueError(f"no checkpoint at {path!r}: no such file or directory")
        raise ValueError("give the env, or a checkpoint (file or run directory) as the "
                         "policy: its env is then the one it was trained on")
    name, _ = _checkpoint_world(None, policy)
    if name is None:
        raise ValueError(f"checkpoint {os.fspath(policy)!r} records no env; give the env")
    from .vector.sources import CALLABLE_PREFIX
    if name.startswith(CALLABLE_PREFIX):
        raise ValueError(
            f"checkpoint {os.fspath(policy)!r} was trained on {name!r}, a Python callable "
            f"without an import path, which no name rebuilds: pass the callable again, "
            f"peregrine.evaluate.evaluate(CALLABLE, {os.fspath(policy)!r}) (a module-level "
            f"function, module:function, works from the command line too)")
    return name


def emulated_env_keywords(env_name: str, policy, overrides: dict) -> dict:
    """An emulated env's keywords (make's arguments and `wrappers`): a checkpoint's own,
    with `overrides` on top."""
    trained = _checkpoint_world(env_name, policy)[1] if is_checkpoint(env_name, policy) else {}
    return {**trained, **overrides}


def evaluate_emulated(env_name: str | Callable, policy: Any, episodes: int = 64, seed: int = 0,
                      num_envs: int | None = None, sample: bool = False, **config) -> dict:
    """`evaluate` for an emulated env (Gymnasium, PettingZoo, a factory): the same
    unbiased count (each env contributes its first episode; rounds of fresh seeds),
    over `min(episodes, num_envs or 16)` envs stepped in this process. Statistics are
    the emulation's: episode_return (a PettingZoo env's: the mean over its agents,
    and its agents' own returns, emulation.agent_returns) and episode_length."""
    from .vector.recipe import EnvRecipe
    from .vector.serial import Serial
    from .vector.sources import EnvFactory, recorded_name
    episodes = _check_positive("episodes", episodes)
    num_envs = min(episodes, 16) if num_envs is None else _check_positive("num_envs", num_envs)
    made_by = env_name      # a name, or the Python callable itself (as load_config takes)
    if callable(env_name):
        env_name = recorded_name(env_name)      # what its checkpoints record
    keywords = emulated_env_keywords(env_name, policy, config)
    factory = EnvFactory.from_keywords(made_by, keywords).vector_envs_of(1)
    # a factory may return a VectorEnv of k envs: each round makes whole ones (a multiple
    # of k envs) and counts the first `instances` envs' first episodes; one recipe, so
    # the env is probed once for the whole evaluation
    recipe = EnvRecipe(factory)
    per_unit = recipe.probe()["envs_per_unit"]
    count, names, mean, std = _run_rounds(
        episodes, num_envs, seed,
        lambda instances, round_seed: Serial(
            recipe, -(-instances // per_unit) * per_unit, seed=round_seed),
        lambda env: make_policy(env_name, policy, env, seed=int(seed), sample=sample),
        lambda env, bound, round_seed, instances: _first_emulated_episodes(
            env, bound, round_seed, instances))
    label = _label(policy)
    world = ", ".join([*([f"keywords {factory.kwargs}"] if factory.kwargs else []),
                       *([f"wrappers {factory.wrappers}"] if factory.wrappers else [])])
    return {"env": env_name, "policy": label, "preset": None,
            "world": world or "as made, no keywords",
            "env_config": dict(factory.kwargs), "seed": int(seed),
            "actions": "sampled" if sample else "mode", "episodes": count,
            "mean": {n: float(v) for n, v in zip(names, mean)},
            "std": {n: float(v) for n, v in zip(names, std)}}


def _label(policy) -> str:
    return os.fspath(policy) if isinstance(policy, (str, os.PathLike)) else type(policy).__name__


def _run_rounds(episodes: int, num_envs: int, seed: int, make_round_env, bind, first_episodes):
    """(count, stat names, means, population stds) over rounds of fresh envs: round r
    makes `make_round_env(instances, seed + r * ROUND_SEED_STRIDE)` with as many
    instances as episodes are still needed (at most num_envs), binds the policy once
    (`bind(env)`; later rounds reset it, a random policy with a fresh seed) and counts
    `first_episodes(env, policy, round_seed, instances)` -> (count, sums, squares)."""
    count, sums, squares, names, bound = 0, None, None, None, None
    for round_index in range(-(-episodes // num_envs)):
        # modulo 2**64: a seed near the top stays a seed (distinct rounds stay distinct)
        round_seed = (int(seed) + round_index * ROUND_SEED_STRIDE) % (1 << 64)
        instances = min(num_envs, episodes - count)
        env = make_round_env(instances, round_seed)
        try:
            if bound is None:
                bound = bind(env)
            elif hasattr(bound, "reset"):
                if isinstance(getattr(bound, "seed", None), int):
                    bound.seed = int(seed) + round_index  # fresh random actions per round
                reset_policy(bound, env)
            names = list(env.stat_names)
            got, got_sums, got_squares = first_episodes(env, bound, round_seed, instances)
        finally:
            env.close()
        count += got
        sums = got_sums if sums is None else sums + got_sums
        squares = got_squares if squares is None else squares + got_squares
    mean = sums / count
    return count, names, mean, np.sqrt(np.maximum(squares / count - mean * mean, 0.0))


def _first_emulated_episodes(env, policy, seed: int, instances: int,
                             max_steps: int = DEFAULT_MAX_EPISODE_STEPS):
    """(count, sums, squares) of the first episode of each of the first `instances` envs
    (a unit holds one env, or the k envs of a VectorEnv): each unit records the episodes
    it finishes, and one step finishes at most one per env. Only the envs with a row
    that ended this step are asked (an episode's end flags a row)."""
    envs = [(unit, index) for block in env.blocks for unit in block.units
            for index in range(unit.num_envs)]
    rows = env.agents_per_env          # each env's rows, in order
    sums = squares = None
    finished = np.arange(len(envs)) >= instances    # extra envs of a whole VectorEnv: not counted
    observations, _ = env.reset(seed=seed)
    for unit in {id(unit): unit for unit, _ in envs}.values():
        unit.episode_stats(clear=True)
    observe_done = getattr(policy, "observe_done", None)
    for _ in range(max_steps + 1):
        observations, _, terminals, truncations, _ = env.step(
            policy_actions(policy, observations, env))
        if observe_done is not None:
            observe_done(terminals, truncations)
        ended = (terminals | truncations).reshape(len(envs), rows).any(1) & ~finished
        for position in np.flatnonzero(ended):
            unit, index = envs[position]
            values = unit.ended_episode(index)
            if values is not None:
                sums = values if sums is None else sums + values
                squares = values ** 2 if squares is None else squares + values ** 2
                finished[position] = True
        if finished.all():
            return instances, sums, squares
    raise RuntimeError(f"episodes did not end within {max_steps + 1} steps")


def policy_actions(policy, observations, env) -> np.ndarray:
    """The policy's actions for `observations` as the batch's action array (its shape
    and dtype): None (a policy that forgot to return), float actions of a discrete
    space and a wrong number of actions are refused."""
    actions = policy(observations)
    shape = env.action_space.shape
    if actions is None:
        raise ValueError(f"the policy returned None; it must return the batch's actions, "
                         f"an array of shape {shape}")
    actions = np.asarray(actions)
    check_integer_actions(env.single_action_space, actions)
    if actions.size != int(np.prod(shape)):
        raise ValueError(f"the policy returned actions of shape {actions.shape}; the batch "
                         f"of {env.num_envs} instance(s) needs {shape}")
    return np.ascontiguousarray(actions, dtype=env.action_space.dtype).reshape(shape)


def _first_episodes(env_name: str, env, policy, seed: int):
    """Steps `env` until every instance finished its first episode.

    Returns (count, sums, squares) over those first episodes, one per instance.
    """
    instances, agents = env.num_envs, env.agents_per_env
    names = list(env.stat_names)
    sums = np.zeros(len(names))
    squares = np.zeros(len(names))
    finished = np.zeros(instances, bool)
    max_steps = int(env.config.get("max_steps", DEFAULT_MAX_EPISODE_STEPS))
    observations, _ = env.reset(seed=seed)
    env.instance_stats(clear=True)
    observe_done = getattr(policy, "observe_done", None)
    for _ in range(max_steps + 1):
        observations, rewards, terminals, truncations, _ = env.step(
            policy_actions(policy, observations, env))
        if observe_done is not None:
            observe_done(terminals, truncations)
        ended = (terminals | truncations).reshape(instances, agents).any(1)
        if not ended.any():
            continue
        # Rows are cleared at every read, so an instance that ended in this
        # step holds exactly this step's episode.
        _episodes, rows = env.instance_stats(clear=True)
        first = ended & ~finished
        sums += rows[first].sum(0)
        squares += (rows[first] ** 2).sum(0)
        finished |= ended
        if finished.all():
            return instances, sums, squares
    raise RuntimeError(f"{env_name}: episodes did not end within {max_steps + 1} steps")
