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

# Gymnasium's max_episode_steps of the ids whose rules are Gymnasium's (the
# spec's, so gymnasium.make adds its TimeLimit as for Gymnasium's own envs). The
# other ids end at their own max_steps, which presets change: their specs carry none.
GYMNASIUM_STEP_LIMITS = {
    "cartpole": 500,
    "pendulum": 200,
    "mountain_car": 200,
    "mountain_car_continuous": 999,
}

# name -> module that draws the env: rgb_frame(env, instance) and RENDER_FPS for
# the exports' render_mode="rgb_array" (every env; multi-agent envs add
# agent_frames, one frame per agent), and render_episode(env, policy, out_path,
# ...) where `peregrine render` writes GIFs of episodes (drone_swarm).
RENDERERS = {
    "cartpole": "peregrine.envs.cartpole.render",
    "pendulum": "peregrine.envs.pendulum.render",
    "mountain_car": "peregrine.envs.mountain_car.render",
    "mountain_car_continuous": "peregrine.envs.mountain_car.render",
    "prospector": "peregrine.envs.prospector.render",
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
    VectorEnv (see peregrine/vector/export.py). Where the id is Gymnasium's, so
    are the spec's max_episode_steps and reward threshold: gymnasium.make then
    ends episodes with Gymnasium's TimeLimit (the instance's own limit is lifted
    unless `max_steps` is given, so `max_episode_steps=k` means k steps, as for
    Gymnasium's envs), and make_vec passes the limit to the batch's max_steps.
    """
    from gymnasium.envs.registration import register, registry

    for name, gymnasium_id in GYMNASIUM_IDS.items():
        env_id = f"{GYMNASIUM_NAMESPACE}/{gymnasium_id}"
        if env_id in registry:
            continue
        original = registry.get(gymnasium_id)
        kwargs: dict[str, Any] = {"name": name}
        if name in GYMNASIUM_STEP_LIMITS:
            kwargs["max_steps"] = None   # the TimeLimit's (single env) or max_episode_steps (vector)
        register(id=env_id,
                 entry_point="peregrine.vector.export:GymnasiumEnv",
                 vector_entry_point="peregrine.vector.export:gymnasium_vector_env",
                 reward_threshold=original.reward_threshold if original else None,
                 max_episode_steps=GYMNASIUM_STEP_LIMITS.get(name),
                 kwargs=kwargs)


class _RegisterAfterImport:
    """A meta path finder (importlib.abc.MetaPathFinder's protocol; that module
    is not imported, it costs more than the rest of `import peregrine`) that
    finds `gymnasium` through the other finders and runs the registration as
    soon as its module has executed: a post-import hook.

    It stays installed until Gymnasium's module has actually executed: a probe
    such as importlib.util.find_spec("gymnasium") (TorchRL makes one on import)
    gets a spec that is never executed, and the import that follows must still
    register.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "gymnasium":
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module
        hook = self

        def exec_module(module):
            execute(module)
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            register_gymnasium_envs()

        spec.loader.exec_module = exec_module
        return spec


def register_gymnasium_envs_on_import() -> None:
    """register_gymnasium_envs now if Gymnasium is imported, else once it is."""
    if "gymnasium" in sys.modules:
        register_gymnasium_envs()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
