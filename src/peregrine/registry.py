"""Names of the environments and where they live; modules load on first use."""
from __future__ import annotations

import importlib

# name -> "module:Class". Adding an env is one line here (plus its folder).
ENVS = {
    "cartpole": "peregrine.envs.cartpole:CartPole",
    "pendulum": "peregrine.envs.pendulum:Pendulum",
    "mountain_car": "peregrine.envs.mountain_car:MountainCar",
    "mountain_car_continuous": "peregrine.envs.mountain_car_continuous:MountainCarContinuous",
    "prospector": "peregrine.envs.prospector:Prospector",
    "drone_swarm": "peregrine.envs.drone_swarm:DroneSwarm",
}


def env_class(name: str):
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; available: {sorted(ENVS)}")
    module_name, class_name = ENVS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def make(name: str, num_envs: int = 1, seed: int | None = None, num_threads: int = 1, **config):
    """Creates a batch of `num_envs` instances of env `name`.

    Keyword arguments beyond the ones shown are the env's config fields (see
    `peregrine envs`), plus `preset=` and `buffers=` where supported.
    """
    return env_class(name)(num_envs=num_envs, seed=seed, num_threads=num_threads, **config)


def list_envs() -> list[str]:
    return sorted(ENVS)
