"""Names of the environments and where they live; modules load on first use.

Every env is also registered with Gymnasium under the `peregrine/` namespace
(register_gymnasium_envs): the registration holds only import strings, so it
builds and imports nothing of the envs. `import peregrine` registers them at
once if Gymnasium is already imported, else right after Gymnasium's own import
(register_gymnasium_envs_on_import), so that importing peregrine alone does
not pay for importing Gymnasium.
"""
from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:   # for annotations only: the envs (and torch) load on first use
    import torch

    from .gpu.batch import DeviceEnv
    from .native.batch import NativeEnv

# name -> "module:Class". Adding an env is one line here (plus its folder).
ENVS = {
    "cartpole": "peregrine.envs.cartpole:CartPole",
    "pendulum": "peregrine.envs.pendulum:Pendulum",
    "mountain_car": "peregrine.envs.mountain_car:MountainCar",
    "mountain_car_continuous": "peregrine.envs.mountain_car_continuous:MountainCarContinuous",
    "prospector": "peregrine.envs.prospector:Prospector",
    "drone_swarm": "peregrine.envs.drone_swarm:DroneSwarm",
}

# name -> Gymnasium id, registered as "peregrine/<id>". The classic envs take
# Gymnasium's own id because their rules, spaces and step limits are
# Gymnasium's (tests/test_gymnasium_api.py checks this against the installed
# Gymnasium); a rule change there means a new version number here.
GYMNASIUM_IDS = {
    "cartpole": "CartPole-v1",
    "pendulum": "Pendulum-v1",
    "mountain_car": "MountainCar-v0",
    "mountain_car_continuous": "MountainCarContinuous-v0",
    "prospector": "Prospector-v0",
    "drone_swarm": "DroneSwarm-v0",
}
GYMNASIUM_NAMESPACE = "peregrine"

# name -> module that draws the env: render_episode(env, policy, out_path, ...)
# for `peregrine render`, and rgb_frame(env, instance) with RENDER_FPS for the
# Gymnasium exports' render_mode="rgb_array".
RENDERERS = {
    "drone_swarm": "peregrine.envs.drone_swarm.render",
}


def env_class(name: str) -> type[NativeEnv]:
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; available: {sorted(ENVS)}")
    module_name, class_name = ENVS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


@overload
def make(name: str, num_envs: int = 1, seed: int | None = None, num_threads: int = 1,
         device: None = None, **config: Any) -> NativeEnv: ...


@overload
def make(name: str, num_envs: int = 1, seed: int | None = None, num_threads: int = 1, *,
         device: str | torch.device, **config: Any) -> DeviceEnv: ...


def make(name: str, num_envs: int = 1, seed: int | None = None, num_threads: int = 1,
         device: str | torch.device | None = None, **config: Any) -> NativeEnv | DeviceEnv:
    """Creates a batch of `num_envs` instances of env `name`.

    Keyword arguments beyond the ones shown are the env's config fields (see
    `peregrine envs`), plus `preset=` and `buffers=` where supported.

    device: None (default) for the C batch on NumPy buffers; "cuda", "cuda:N"
    or "cpu" for the same env with torch-tensor buffers on that device
    (`peregrine.envs.gpu.batch.DeviceEnv`: on CUDA the env's header runs one GPU
    thread per instance).
    """
    cls = env_class(name)
    if device is None:
        return cls(num_envs=num_envs, seed=seed, num_threads=num_threads, **config)
    from .gpu.batch import DeviceEnv
    return DeviceEnv(cls, num_envs=num_envs, seed=seed, device=device,
                     num_threads=num_threads, **config)


def list_envs() -> list[str]:
    return sorted(ENVS)


def register_gymnasium_envs() -> None:
    """Registers every env as "peregrine/<id>" with Gymnasium (idempotent).

    gymnasium.make(id) gives one instance as a gymnasium.Env, and
    gymnasium.make_vec(id, num_envs=N) a native batch of N behind Gymnasium's
    VectorEnv (see peregrine/vector/export.py). The step limit is the env's
    own `max_steps` config field, so the specs carry no max_episode_steps;
    reward thresholds are Gymnasium's where the id is Gymnasium's.
    """
    from gymnasium.envs.registration import register, registry

    for name, gymnasium_id in GYMNASIUM_IDS.items():
        env_id = f"{GYMNASIUM_NAMESPACE}/{gymnasium_id}"
        if env_id in registry:
            continue
        original = registry.get(gymnasium_id)
        register(id=env_id,
                 entry_point="peregrine.vector.export:GymnasiumEnv",
                 vector_entry_point="peregrine.vector.export:gymnasium_vector_env",
                 reward_threshold=original.reward_threshold if original else None,
                 kwargs={"name": name})


class _RegisterAfterImport:
    """A meta path finder (importlib.abc.MetaPathFinder's protocol; that module
    is not imported, it costs more than the rest of `import peregrine`) that
    finds `gymnasium` through the other finders and runs the registration as
    soon as its module has executed: a post-import hook, used once."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "gymnasium":
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec
        spec = find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            register_gymnasium_envs()

        spec.loader.exec_module = exec_module
        return spec


def register_gymnasium_envs_on_import() -> None:
    """register_gymnasium_envs now if Gymnasium is imported, else once it is."""
    if "gymnasium" in sys.modules:
        register_gymnasium_envs()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
