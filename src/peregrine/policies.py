"""The scripted-policy catalogue: names, construction, and checkpoint actors.

`make_policy(env_name, policy, env, seed)` resolves what a user or a config
names as a policy to an object bound to `env`, callable(observations) ->
actions:
- a scripted policy name: "random" for any env (uniform over its action
  space), plus the env's own baselines (`SCRIPTED`, e.g. drone_swarm's
  "lawnmower" and "voronoi", prospector's "trader");
- a checkpoint path (file or run directory), loaded with
  `peregrine.train.checkpoint.load_actor(path, env)` (needs torch);
- a policy object: callable(observations) -> actions, optionally with
  `reset(env)` and `observe_done(terminals, truncations)`.

Used by evaluation (`peregrine.evaluate`), rendering and the trainer's
kickstarting teacher.
"""
from __future__ import annotations

import os

#: env name -> module holding `POLICIES` (name -> class(seed=...)) of scripted policies
SCRIPTED = {
    "drone_swarm": "peregrine.envs.drone_swarm.baselines",
    "prospector": "peregrine.envs.prospector.scripted",
}


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


def make_policy(env_name: str, policy, env, seed: int = 0, check_world: bool = True):
    """Resolves `policy` (name, checkpoint path or object) to an object bound to `env`."""
    if not isinstance(policy, (str, os.PathLike)):
        if not callable(policy):
            raise ValueError(f"policy must be a scripted policy name, a checkpoint path or a "
                             f"callable, got {type(policy).__name__}")
        if hasattr(policy, "reset"):
            reset_policy(policy, env)
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
    return load_checkpoint_policy(text, env, check_world)


def load_checkpoint_policy(path: str, env, check_world: bool = True):
    """The deterministic actor of a checkpoint; ValueError with the reason if it cannot load."""
    try:
        from .train.checkpoint import load_actor
    except ImportError as error:
        raise ValueError(f"cannot load checkpoint {path!r}: the trainer "
                         f"(peregrine.train.checkpoint.load_actor, needs torch) is not "
                         f"available: {error}") from None
    try:
        actor = load_actor(path, env, check_world=check_world)
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - any decoding failure is a bad file
        raise ValueError(f"cannot load checkpoint {path!r}: {type(error).__name__}: {error}") from None
    if hasattr(actor, "reset"):
        actor.reset()
    return actor


def reset_policy(policy, env) -> None:
    """Binds a policy object to `env`: `reset(env)`, or `reset()` for those that take no env."""
    try:
        policy.reset(env)
    except TypeError:
        policy.reset()
