"""Policies as users name them: scripted names, checkpoints and policy objects.

`make_policy(env_name, policy, env, seed)` resolves what a user or a config
names as a policy to an object bound to `env`, callable(observations) ->
actions:
- a scripted policy name: "random" for any env (uniform over its action
  space), plus the env's own baselines (the catalogue in
  `peregrine.envs.scripted`, e.g. drone_swarm's "lawnmower" and "voronoi",
  prospector's "trader");
- a checkpoint path (file or run directory), loaded with
  `peregrine.train.checkpoint.load_actor(path, env)` (needs torch);
- a policy object: callable(observations) -> actions, optionally with
  `reset(env)` and `observe_done(terminals, truncations)`.

Used by evaluation (`peregrine.evaluate`) and rendering.
"""
from __future__ import annotations

from .envs.scripted import resolve_policy


def make_policy(env_name: str, policy, env, seed: int = 0, check_world: bool = True,
                sample: bool = False):
    """Resolves `policy` (name, checkpoint path or object) to an object bound to `env`.
    `sample`: a checkpoint's actor samples its actions (seeded by `seed`) instead of
    taking the mode; ValueError for any other policy."""
    loaded = []

    def load(path):
        loaded.append(path)
        return load_checkpoint_policy(path, env, check_world, int(seed) if sample else None)
    bound = resolve_policy(env_name, policy, env, seed, load)
    if sample and not loaded:
        raise ValueError(f"sampling actions applies to a checkpoint's policy; {policy!r} is "
                         f"not a checkpoint")
    return bound


def load_checkpoint_policy(path: str, env, check_world: bool = True,
                           sample_seed: int | None = None):
    """The actor of a checkpoint (the mode of its distribution, or samples seeded by
    `sample_seed`); ValueError with the reason if it cannot load."""
    try:
        from .train.checkpoint import load_actor
    except ImportError as error:
        raise ValueError(f"cannot load checkpoint {path!r}: the trainer "
                         f"(peregrine.train.checkpoint.load_actor, needs torch) is not "
                         f"available: {error}") from None
    try:
        actor = load_actor(path, env, check_world=check_world, sample_seed=sample_seed)
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - any decoding failure is a bad file
        raise ValueError(f"cannot load checkpoint {path!r}: {type(error).__name__}: {error}") from None
    return actor
