"""Names of the environments and where they live; modules load on first use.

Every env is also registered with Gymnasium under the `peregrine/` namespace
(register_gymnasium_envs): the registration holds only import strings, so it
builds and imports nothing of the envs. `import peregrine` registers them at
once if Gymnasium is already imported, else right after Gymnasium's own import
(register_gymnasium_envs_on_import), so that importing peregrine alone does
not pay for importing Gymnasium.
"""
from __future__ import annotations

import copyreg
import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, overload

if TYPE_CHECKING:   # for annotations only: the envs (and torch) load on first use
    import torch

    from .gpu.batch import DeviceEnv
    from .native.batch import NativeEnv

class EnvEntry(NamedTuple):
    """What names a native env: its class ("module:Class", imported on first use) and
    the facts the exports need without importing it."""
    target: str
    # The Gymnasium id, registered as "peregrine/<id>" (default: the env's name). The
    # classic envs take Gymnasium's own id because their rules, spaces and step limits
    # are Gymnasium's (tests/test_gymnasium_api.py checks this against the installed
    # Gymnasium); a rule change there means a new version number here.
    gymnasium_id: str | None = None
    # Gymnasium's max_episode_steps of the ids whose rules are Gymnasium's (the spec's,
    # so gymnasium.make adds its TimeLimit as for Gymnasium's own envs). The other ids
    # end at their own max_steps, which presets change: their specs carry none.
    step_limit: int | None = None
    # The module that draws the env: rgb_frame(env, instance) and RENDER_FPS for the
    # exports' render_mode="rgb_array" (multi-agent envs add agent_frames), and
    # render_episode(env, policy, out_path, ...) where `peregrine render` writes GIFs.
    renderer: str | None = None
    # Where it comes from: "built-in", the distribution of a plugin, or "loaded".
    source: str = "built-in"


# The one table of the built-in envs. A plugin adds its envs through the entry-point
# group "peregrine.envs" (name = "package.module:Class", ENTRY_POINT_GROUP), found the
# same way the first time a name is asked for; peregrine.envs.load adds an env built at
# run time. Adding a built-in env is one entry here plus its folder (setup.py builds
# every envs/NAME/NAME.h).
BUILT_IN = {
    "cartpole": EnvEntry("peregrine.envs.cartpole:CartPole", "CartPole-v1", 500,
                         "peregrine.envs.cartpole.render"),
    "pendulum": EnvEntry("peregrine.envs.pendulum:Pendulum", "Pendulum-v1", 200,
                         "peregrine.envs.pendulum.render"),
    "mountain_car": EnvEntry("peregrine.envs.mountain_car:MountainCar", "MountainCar-v0", 200,
                             "peregrine.envs.mountain_car.render"),
    "mountain_car_continuous": EnvEntry(
        "peregrine.envs.mountain_car_continuous:MountainCarContinuous",
        "MountainCarContinuous-v0", 999, "peregrine.envs.mountain_car.render"),
    "prospector": EnvEntry("peregrine.envs.prospector:Prospector", "Prospector-v0", None,
                           "peregrine.envs.prospector.render"),
    "drone_swarm": EnvEntry("peregrine.envs.drone_swarm:DroneSwarm", "DroneSwarm-v0", None,
                            "peregrine.envs.drone_swarm.render"),
}
ENTRY_POINT_GROUP = "peregrine.envs"
GYMNASIUM_NAMESPACE = "peregrine"

_LOADED: dict[str, type] = {}       # envs built at run time (peregrine.envs.load)


class _Table(Mapping):
    """Every native env: the built-in table, the plugins' entry points (read once, on
    first use, so `import peregrine` stays light) and envs loaded at run time."""

    def __init__(self):
        self._entries: dict[str, EnvEntry] | None = None

    def _all(self) -> dict[str, EnvEntry]:
        if self._entries is None:
            entries = dict(BUILT_IN)
            for point in _entry_points():
                entry = EnvEntry(point.value, source=_distribution(point))
                if point.name in entries:
                    raise ValueError(
                        f"env name clash: {point.name!r} of the plugin {entry.source!r} is "
                        f"already taken by {entries[point.name].source!r} "
                        f"({entries[point.name].target}); rename one of them")
                entries[point.name] = entry
            for name, cls in _LOADED.items():
                entries[name] = EnvEntry(f"{cls.__module__}:{cls.__qualname__}",
                                         source="loaded")
            self._entries = entries
        return self._entries

    def add(self, name: str, entry: EnvEntry) -> None:
        self._all()[name] = entry

    def refresh(self) -> None:
        """Reads the entry points again on next use (after installing a plugin in this
        process); envs loaded at run time stay."""
        self._entries = None

    def __getitem__(self, name):
        return self._all()[name].target

    def __iter__(self):
        return iter(self._all())

    def __len__(self):
        return len(self._all())

    def entry(self, name: str) -> EnvEntry:
        return self._all()[name]


def _entry_points():
    from importlib.metadata import entry_points
    return entry_points(group=ENTRY_POINT_GROUP)


def _distribution(point) -> str:
    dist = getattr(point, "dist", None)
    return f"plugin {dist.name}" if dist is not None else "a plugin"


# name -> "module:Class" of every native env (a read-only mapping).
ENVS = _Table()


def _column(field: str) -> dict:
    return {name: getattr(entry, field) for name, entry in BUILT_IN.items()
            if getattr(entry, field) is not None}


# Views of the built-in table, by column.
GYMNASIUM_IDS = _column("gymnasium_id")
GYMNASIUM_STEP_LIMITS = _column("step_limit")
RENDERERS = _column("renderer")


def renderer(name: str) -> str | None:
    """The drawing module of env `name` (a plugin's: its class's `renderer`), or None."""
    entry = ENVS.entry(name)
    if entry.renderer is not None or entry.source == "built-in":
        return entry.renderer
    return getattr(env_class(name), "renderer", None)


def register(name: str, cls: type, replace: bool = False) -> None:
    """Adds `cls` (a NativeEnv subclass) as env `name` for this process (what
    peregrine.envs.load does). A name taken by a built-in env or a plugin is refused;
    `replace` lets a loaded env be rebuilt under its own name."""
    if name in ENVS and not (replace and ENVS.entry(name).source == "loaded"):
        raise ValueError(f"env name clash: {name!r} is already taken by "
                         f"{ENVS.entry(name).source!r} ({ENVS[name]}); choose another name")
    _LOADED[name] = cls
    ENVS.add(name, EnvEntry(f"{cls.__module__}:{cls.__qualname__}", source="loaded"))


class _LoadedEnvClass(type):
    """The type of an env class built by `load`: it pickles as "load this header
    again" (a cache hit in the new process), so spawned workers can rebuild it."""


# Envs built by `load`, by class name: a class is found here by its qualified name
# ("loaded.MyEnv"), so cloudpickle (Multiprocessing's) pickles it by reference too,
# which then goes through _reduce_loaded instead of copying the class by value.
loaded = SimpleNamespace()


def _reduce_loaded(cls):
    return load, (str(cls.header), cls.name)


copyreg.pickle(_LoadedEnvClass, _reduce_loaded)


def load(header: str | os.PathLike[str], name: str | None = None, **attributes: Any) -> type:
    """Builds the C env `header` at run time and registers it as env `name` (default:
    the header's stem) for this process: `peregrine.make(name)`, the vector backends,
    `peregrine train` in Python, `check_env` and the GPU batch (its header) then take it
    like a built-in env. Returns its NativeEnv class.

    The build is cached by the hash of the source (envs/sdk.py), so loading an
    unchanged header again imports it, and an edited one is rebuilt: re-running a
    notebook cell gives the new env. A compiler error is a NativeBuildError holding the
    compiler's `file:line: message` lines; no compiler, one line saying so.
    `attributes` become class attributes (e.g. observation_bounds, renderer)."""
    from . import sdk
    from .native.batch import NativeEnv
    header = Path(header).resolve()
    name = sdk.check_name(name or header.stem)
    module, _built = sdk.build_module(header, name)
    known = _LOADED.get(name)
    if known is not None and known.native_module is module and not attributes:
        return known      # the same build: the same class (pickles and `is` agree)
    class_name = "".join(part.title() for part in name.split("_"))
    cls = _LoadedEnvClass(
        class_name, (NativeEnv,),
        {"name": name, "native_module": module, "header": header,
         "__module__": __name__, "__qualname__": f"loaded.{class_name}",
         "__doc__": f"The C env {header.name}, built at run time.", **attributes})
    setattr(loaded, class_name, cls)
    register(name, cls, replace=True)
    if "gymnasium" in sys.modules:
        register_gymnasium_envs()
    return cls


def unload(name: str) -> None:
    """Forgets env `name` that `load` registered in this process (a built-in or plugin
    env cannot be unloaded). Instances already made keep working."""
    if name not in _LOADED:
        raise ValueError(f"{name!r} was not loaded with peregrine.envs.load")
    cls = _LOADED.pop(name)
    if getattr(loaded, cls.__name__, None) is cls:
        delattr(loaded, cls.__name__)
    ENVS.refresh()


def parallel_env(name: str, render_mode: str | None = None, **config: Any):
    """One instance of native env `name` as a PettingZoo ParallelEnv, one agent a row:
    the env package's own `parallel_env` where it has one (DroneSwarm's), else the
    generic view (native/parallel.py) drawn by the env's renderer. Keywords: the env's
    config fields, `preset`, `max_cycles`, `render_size`. Needs PettingZoo."""
    cls = env_class(name)
    own = getattr(importlib.import_module(cls.__module__), "parallel_env", None)
    if own is not None and own is not parallel_env:
        return own(render_mode=render_mode, **config)
    try:
        from .native.parallel import NativeParallelEnv
    except ImportError as error:
        raise ImportError("a PettingZoo view needs PettingZoo: pip install "
                          "'peregrine-rl[pettingzoo]'") from error
    return NativeParallelEnv(cls, render_mode=render_mode, renderer=renderer(name), **config)


def _unbuilt_hint(error: BaseException) -> str:
    """For an env's compiled module that is not there (a source checkout not built,
    whose import fails as "cannot import name '_cartpole' from partially initialized
    module"): how to build it."""
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if "cannot import name '_" in str(error) or (missing or "").rpartition(".")[2].startswith("_"):
        return (" (its C extension is not built: `pip install -e .` in the source checkout, "
                "or `python setup.py build_ext --inplace`)")
    return ""


def env_class(name: str) -> type[NativeEnv]:
    if name in _LOADED:
        return _LOADED[name]
    if name not in ENVS:
        other = (f" ({name!r} names a Gymnasium, PettingZoo or factory env: "
                 f"peregrine.vector.make takes it)" if isinstance(name, str) and ":" in name
                 else "")
        raise ValueError(f"unknown env {name!r}; available: {sorted(ENVS)}{other}")
    module_name, class_name = ENVS[name].split(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"env {name!r} ({ENVS.entry(name).source}) could not be imported "
                         f"from {ENVS[name]}: {error}{_unbuilt_hint(error)}") from None
    if getattr(cls, "name", name) != name:
        raise ValueError(f"env {name!r} ({ENVS.entry(name).source}) points to {ENVS[name]}, "
                         f"whose name is {getattr(cls, 'name', None)!r}")
    return cls


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
    from gymnasium.envs.registration import register as register_id, registry

    for name in ENVS:
        entry = ENVS.entry(name)
        gymnasium_id = entry.gymnasium_id or name
        env_id = f"{GYMNASIUM_NAMESPACE}/{gymnasium_id}"
        if env_id in registry:
            continue
        original = registry.get(gymnasium_id) if entry.gymnasium_id else None
        kwargs: dict[str, Any] = {"name": name}
        if entry.step_limit is not None:
            kwargs["max_steps"] = None   # the TimeLimit's (single env) or max_episode_steps (vector)
        register_id(id=env_id,
                    entry_point="peregrine.vector.export:GymnasiumEnv",
                    vector_entry_point="peregrine.vector.export:gymnasium_vector_env",
                    reward_threshold=original.reward_threshold if original else None,
                    max_episode_steps=entry.step_limit, kwargs=kwargs)


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
