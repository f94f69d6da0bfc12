"""The scripted-policy catalogue: "random" for every env, plus each env's own
baselines (drone_swarm's "lawnmower" and "voronoi", prospector's "trader").

A scripted policy reads observations only and lives in its env's folder; this
catalogue names them. `resolve_policy` is the one rule for what a user names
as a policy (a scripted name, a checkpoint path, a policy object); the layers
that can read checkpoints hand it their loader (`peregrine.policies` for
evaluation and rendering, `peregrine.train.kickstart` for the teacher).
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable

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


def _env_policies(env_name: str) -> dict:
    return importlib.import_module(SCRIPTED[env_name]).POLICIES if env_name in SCRIPTED else {}


def scripted_policy_names(env_name: str) -> list[str]:
    """Names accepted as `policy` for this env (besides checkpoint paths)."""
    return sorted({"random"} | set(_env_policies(env_name)))


def make_scripted_policy(env_name: str, name: str, env, seed: int = 0):
    """The scripted policy `name` of env `env_name`, bound to `env`.

    Callers that also take checkpoint paths call it for every name that is not an
    existing path, so an unknown name's error says both what it is not."""
    classes = _env_policies(env_name)
    if name in classes:
        policy = classes[name](seed=seed)
    elif name == "random":
        policy = RandomPolicy(seed=seed)
    else:
        raise ValueError(f"unknown policy {name!r} for {env_name}: not a scripted policy "
                         f"({', '.join(scripted_policy_names(env_name))}) and no checkpoint "
                         f"file or run directory exists at that path")
    policy.reset(env)
    return policy


def reset_policy(policy, env) -> None:
    """Binds a policy object to `env`: `reset(env)`, or `reset()` for those that take no env."""
    try:
        policy.reset(env)
    except TypeError:
        policy.reset()


def resolve_policy(env_name: str, policy: Any, env, seed: int,
                   load_checkpoint: Callable[[str], Any]):
    """`policy` bound to `env`: a scripted policy name, a checkpoint path (read by
    `load_checkpoint(path)`, which the caller supplies) or a policy object,
    callable(observations) -> actions, optionally with `reset(env)`."""
    if isinstance(policy, (str, os.PathLike)):
        text = os.fspath(policy)
        if text in scripted_policy_names(env_name) or not os.path.exists(text):
            return make_scripted_policy(env_name, text, env, seed)   # unknown: names the choices
        policy = load_checkpoint(text)
    elif not callable(policy):
        raise ValueError(f"policy must be a scripted policy name, a checkpoint path or a "
                         f"callable, got {type(policy).__name__}")
    if hasattr(policy, "reset"):
        reset_policy(policy, env)
    return policy
