"""Where an env comes from: the names a user gives, resolved to something that makes it.

One string names an env everywhere (`peregrine train NAME`, `env.name` in TOML,
`peregrine.train.train`, eval, render, checkpoints):

    cartpole                                   a native Peregrine env (peregrine envs)
    gym:LunarLander-v3                         gymnasium.make("LunarLander-v3", **kwargs)
    gym:ALE/Pong-v5                            the same; the namespace's package is imported
    gym:minigrid:MiniGrid-DoorKey-5x5-v0       Gymnasium's own "module:id": import, then make
    gym-vec:ALE/Pong-v5                        gymnasium.make_vec("ALE/Pong-v5", **kwargs): a
                                               VectorEnv (here ALE's own, C++ threads and
                                               Atari preprocessing), num_envs envs per call,
                                               auto-resetting in the same step
    pettingzoo:butterfly.knights_archers_zombies_v11
                                               that PettingZoo module's parallel_env(**kwargs)
    my_package.envs:make_env                   a factory: import the module, call the function
                                               with **kwargs; it returns a Gymnasium env or a
                                               PettingZoo ParallelEnv (or AEC env, converted)

and in Python a callable does the same as a factory path. `EnvFactory` holds the
resolved name, the keyword arguments and the wrappers; it is a plain picklable
object, so Multiprocessing's spawned workers rebuild the env from it, and a
checkpoint's config records exactly what made its env.

Wrappers are config, not code: `env.wrappers` lists Gymnasium wrappers applied in
order in each worker, each a class name of `gymnasium.wrappers` (or a
`module:Class` path) alone or as a table with its arguments:

    wrappers = ["NormalizeObservation", {name = "FrameStackObservation", stack_size = 4}]

A package that is missing is a one-line error naming what to install.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import pkgutil
from typing import Any, Callable

GYM_PREFIX = "gym:"
GYM_VECTOR_PREFIX = "gym-vec:"
PETTINGZOO_PREFIX = "pettingzoo:"
CALLABLE_PREFIX = "python:"     # a callable env without an import path, as recorded

# Gymnasium id namespaces (and id prefixes) whose envs register when a package is
# imported: imported before gymnasium.make, as Gymnasium 1.x no longer loads plugins.
NAMESPACE_MODULES = {"ALE/": "ale_py", "MiniGrid-": "minigrid", "BabyAI-": "minigrid"}

# Import name -> what to pip install, for the one-line hint.
INSTALL_HINTS = {
    "Box2D": 'pip install "gymnasium[box2d]"',
    "mujoco": 'pip install "gymnasium[mujoco]"',
    "ale_py": "pip install ale-py",
    "minigrid": "pip install minigrid",
    "pettingzoo": "pip install pettingzoo",
    "pygame": "pip install pygame",
    "pymunk": 'pip install "pettingzoo[butterfly]"',
    "chess": 'pip install "pettingzoo[classic]"',
    "rlcard": 'pip install "pettingzoo[classic]"',
}


class EnvSourceError(ValueError):
    """An env name that cannot be resolved, imported or made (one line, with the fix)."""


class EnvKeywordError(EnvSourceError):
    """The env could not be made with the keywords it was given; `keywords` names them."""

    def __init__(self, message: str, keywords=()):
        super().__init__(message)
        self.keywords = list(keywords)


def _it_takes(made) -> str:
    """"; it takes: a, b" naming the keyword arguments a callable (a class: its __init__)
    names; "" where it takes any (**kwargs) or its signature cannot be read."""
    if made is None:
        return ""
    try:
        parameters = inspect.signature(made).parameters.values()
    except (TypeError, ValueError):
        return ""
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return ""
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
             and p.name not in ("self", "env")]
    return f"; it takes: {', '.join(names)}" if names else ""


def _first_line(error: BaseException) -> str:
    """An exception's message as one line (its first), or its type's name if it has none."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _gymnasium_entry(env_id: str):
    """The callable a Gymnasium id's spec makes, or None (its signature names the
    keywords; gymnasium.make's own ones, render_mode and the like, are not listed)."""
    try:
        import gymnasium
        from gymnasium.envs.registration import load_env_creator
        entry = gymnasium.spec(env_id).entry_point
        return load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception:       # any failure here only loses the list of keywords
        return None


def is_native_name(name) -> bool:
    """True for the name of a native env (ours or a registered one)."""
    from ..envs.registry import ENVS
    return isinstance(name, str) and name in ENVS


def describe_kinds() -> str:
    return ("a native env (see `peregrine envs`), gym:ID (a Gymnasium id), gym-vec:ID "
            "(its vector env), pettingzoo:MODULE (e.g. "
            "pettingzoo:butterfly.knights_archers_zombies_v11) or a factory module:function")


def kind_of(name: str) -> str:
    """"native", "gymnasium", "gymnasium_vector", "pettingzoo" or "factory";
    EnvSourceError otherwise."""
    if not isinstance(name, str) or not name:
        raise EnvSourceError(f"an env name must be a non-empty string, got {name!r}")
    if is_native_name(name):
        return "native"
    if name.startswith(GYM_PREFIX):
        if not name[len(GYM_PREFIX):]:
            raise EnvSourceError("gym: needs an id after it, e.g. gym:LunarLander-v3")
        return "gymnasium"
    if name.startswith(GYM_VECTOR_PREFIX):
        if not name[len(GYM_VECTOR_PREFIX):]:
            raise EnvSourceError("gym-vec: needs an id after it, e.g. gym-vec:ALE/Pong-v5")
        return "gymnasium_vector"
    if name.startswith(PETTINGZOO_PREFIX):
        if not name[len(PETTINGZOO_PREFIX):]:
            raise EnvSourceError("pettingzoo: needs a module after it, e.g. "
                                 "pettingzoo:butterfly.knights_archers_zombies_v11")
        return "pettingzoo"
    module, sep, function = name.partition(":")
    if sep and module and function and all(part.isidentifier() for part in module.split(".")) \
            and all(part.isidentifier() for part in function.split(".")):
        return "factory"
    from ..envs.registry import ENVS
    raise EnvSourceError(f"unknown env {name!r}: give {describe_kinds()}; native envs: "
                         f"{sorted(ENVS)}")


def callable_path(function: Callable) -> str | None:
    """"module:qualname" that imports back to `function`, or None (a lambda, a closure,
    a bound method, or a function of __main__ that a spawned worker cannot import)."""
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is function else None


def recorded_name(function: Callable) -> str:
    """The name a config and its checkpoints record for a Python callable env: its
    import path (module:qualname), or "python:QUALNAME" for one that has none (a
    lambda, a closure), which only the callable itself, passed again, can rebuild."""
    path = callable_path(function)
    return path or f"{CALLABLE_PREFIX}{getattr(function, '__qualname__', type(function).__name__)}"


def _import(module: str, for_name: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise EnvSourceError(_missing(error, for_name)) from None


def _missing(error: ModuleNotFoundError, for_name: str) -> str:
    """The one line for a module that does not import: the package to install; where
    the package is there and one of its modules is not (a misspelt PettingZoo env or
    factory module), the modules that package does have; where the module a factory
    path names is nowhere, how to put it on the path."""
    missing = error.name or ""
    top = missing.split(".")[0]
    if "." in missing and importlib.util.find_spec(top) is not None:
        parent = missing.rpartition(".")[0]
        try:
            found = sorted(info.name for info in pkgutil.iter_modules(
                importlib.import_module(parent).__path__) if not info.name.startswith("_"))
        except (ImportError, AttributeError):
            found = []
        listed = f"; {parent} has: {', '.join(found)}" if found else ""
        return f"env {for_name!r}: there is no module {missing!r}{listed}"
    if top and top not in INSTALL_HINTS and for_name.partition(":")[0].split(".")[0] == top:
        return (f"env {for_name!r}: no module {top!r} on the Python path: install it, or "
                f"put its folder on PYTHONPATH (PYTHONPATH=. for a {top}.py here)")
    hint = INSTALL_HINTS.get(top, f"pip install {top}" if top else "install it")
    return f"env {for_name!r} needs the package {top!r}, which is not installed: {hint}"


def _resolve_attribute(module_name: str, path: str, for_name: str):
    found: Any = _import(module_name, for_name)
    for part in path.split("."):
        if not hasattr(found, part):
            raise EnvSourceError(f"env {for_name!r}: module {module_name!r} has no {path!r}")
        found = getattr(found, part)
    return found


def _tupled(value):
    """A TOML array as a tuple (nested ones too): what Gymnasium's wrappers take for
    shapes (ResizeObservation(shape=(64, 64)) refuses a list)."""
    return tuple(_tupled(item) for item in value) if isinstance(value, list) else value


def resolve_wrapper(wrapper) -> tuple[type, dict]:
    """(wrapper class, its keyword arguments) of one `env.wrappers` entry; arrays are
    passed as tuples."""
    if isinstance(wrapper, str):
        name, kwargs = wrapper, {}
    elif isinstance(wrapper, dict) and isinstance(wrapper.get("name"), str):
        kwargs = {key: _tupled(value) for key, value in wrapper.items() if key != "name"}
        name = wrapper["name"]
    else:
        raise EnvSourceError(f"env.wrappers entries are a wrapper name or a table "
                             f"{{name = \"...\", ARG = VALUE}}, got {wrapper!r}")
    if ":" in name:
        module, _, attribute = name.partition(":")
        cls = _resolve_attribute(module, attribute, name)
    else:
        import gymnasium.wrappers
        cls = getattr(gymnasium.wrappers, name, None)
        if cls is None:
            raise EnvSourceError(f"env.wrappers: {name!r} is not a class of gymnasium.wrappers; "
                                 f"give one of its names (e.g. NormalizeObservation) or a "
                                 f"module:Class path")
    return cls, kwargs


def check_wrappers(wrappers) -> list:
    """`env.wrappers` as a list of entries, each resolvable (checked now, not in a worker)."""
    if wrappers is None:
        return []
    if not isinstance(wrappers, (list, tuple)):
        raise EnvSourceError(f"env.wrappers must be a list, got {wrappers!r}")
    for wrapper in wrappers:
        resolve_wrapper(wrapper)
    return list(wrappers)


class EnvFactory:
    """Makes one env object from a name (not native), keyword arguments and wrappers.

    Picklable (it holds only plain data, or a callable that pickles by reference),
    so it is what the vector backends' workers call. `name` is what config files
    and checkpoints record; for a Python callable without an import path it is
    None, and such an env is rebuilt only by passing the callable again.
    """

    def __init__(self, env: str | Callable, kwargs: dict | None = None, wrappers=()):
        self.kwargs = dict(kwargs or {})
        self.wrappers = check_wrappers(wrappers)
        if callable(env) and not isinstance(env, str):
            self.function = env
            self.name = callable_path(env)
            self.kind = "factory"
            self.__name__ = getattr(env, "__name__", type(env).__name__)
            return
        self.kind = kind_of(env)
        if self.kind == "native":
            raise EnvSourceError(f"{env!r} is a native env: make it with peregrine.make or "
                                 f"peregrine.vector.make, not through a factory")
        self.name = env
        self.function = None
        self.__name__ = env

    @classmethod
    def from_keywords(cls, env: str | Callable, keywords: dict | None = None) -> "EnvFactory":
        """The factory of an [env] section's keywords: make's arguments, with the
        wrappers under "wrappers" (as config files and checkpoints record them)."""
        kwargs = dict(keywords or {})
        wrappers = kwargs.pop("wrappers", ())
        return cls(env, kwargs, wrappers)

    def vector_envs_of(self, count: int) -> "EnvFactory":
        """This factory, except that a gym-vec: one makes vector envs of `count` envs
        (`vector.make` gives each worker one of its share; evaluation and render one
        env each, so that each made unit is one env)."""
        if self.kind != "gymnasium_vector":
            return self
        return EnvFactory(self.name, {**self.kwargs, "num_envs": int(count)}, self.wrappers)

    def __repr__(self) -> str:
        return f"EnvFactory({self.name or self.__name__!r}, kwargs={self.kwargs!r}, " \
               f"wrappers={self.wrappers!r})"

    def __call__(self):
        env = self._make()
        if self.wrappers and self.kind != "gymnasium_vector":   # that one wraps each env
            from gymnasium import Env
            if not isinstance(env, Env):
                pettingzoo = self.kind == "pettingzoo" or hasattr(env, "possible_agents")
                raise EnvSourceError(
                    f"env {self.__name__!r}: env.wrappers are Gymnasium wrappers, but the "
                    f"env is {type(env).__name__}, not a gymnasium.Env"
                    + (": wrap a PettingZoo env in a factory of your own (module:function, "
                       "e.g. with SuperSuit's resize_v1 or color_reduction_v0)"
                       if pettingzoo else ""))
            from gymnasium.error import DependencyNotInstalled
            for wrapper in self.wrappers:
                cls, kwargs = resolve_wrapper(wrapper)
                try:
                    env = cls(env, **kwargs)
                except DependencyNotInstalled as error:
                    raise EnvSourceError(
                        f"env.wrappers: {cls.__name__} needs a package that is not installed: "
                        f"{_first_line(error)}") from None
                except TypeError as error:
                    raise EnvSourceError(
                        f"env.wrappers: {cls.__name__} could not be made with {kwargs!r}: "
                        f"{_first_line(error)}{_it_takes(cls)}") from None
        return env

    def _make(self):
        name = self.__name__
        try:
            if self.kind == "gymnasium":
                return self._make_gymnasium(self.name[len(GYM_PREFIX):])
            if self.kind == "gymnasium_vector":
                return self._make_gymnasium(self.name[len(GYM_VECTOR_PREFIX):], vector=True)
            if self.kind == "pettingzoo":
                _import("pettingzoo", name)     # its absence named before the module's
                module = "pettingzoo." + self.name[len(PETTINGZOO_PREFIX):]
                found = _import(module, name)
                if not hasattr(found, "parallel_env") and hasattr(found, "env"):
                    from .emulation import TURN_BASED     # an AEC module, classic's games
                    raise EnvSourceError(TURN_BASED.format(f"env {name!r}"))
                made = _resolve_attribute(module, "parallel_env", name)
                with self._keywords_named(made):
                    return made(**self.kwargs)
            function = self.function
            if function is None:
                module, _, attribute = self.name.partition(":")
                function = _resolve_attribute(module, attribute, name)
            with self._keywords_named(function):
                return function(**self.kwargs)
        except ModuleNotFoundError as error:    # raised inside the env's own import
            raise EnvSourceError(_missing(error, name)) from None
        except ImportError as error:
            raise EnvSourceError(f"env {name!r} could not be imported: "
                                 f"{_first_line(error)}") from None

    @contextlib.contextmanager
    def _keywords_named(self, made=None):
        """A TypeError or ValueError while the env is made with keywords (--env.KEY, [env]
        keys) as one line naming them, their values and the keywords `made` takes where
        its signature says; without keywords the error is the env's own, traceback and all."""
        try:
            yield
        except (TypeError, ValueError) as error:
            if not self.kwargs or isinstance(error, EnvSourceError):
                raise
            given = ", ".join(f"{key}={value!r}" for key, value in self.kwargs.items())
            raise EnvKeywordError(
                f"env {self.__name__!r} could not be made with the keywords {given}: "
                f"{_first_line(error)}{_it_takes(made)}", keywords=list(self.kwargs)) from None

    def _make_gymnasium(self, env_id: str, vector: bool = False):
        import gymnasium
        from gymnasium.error import DependencyNotInstalled, Error
        for prefix, module in NAMESPACE_MODULES.items():
            if env_id.startswith(prefix):
                imported = _import(module, self.name)
                if module == "ale_py":      # ALE registers its ids through this call
                    gymnasium.register_envs(imported)
        if ":" in env_id:     # "module:ID": the module imported here, so a missing one is named
            _import(env_id.partition(":")[0], self.name)
        try:
            # (make_vec's keywords are its own and the env's: none listed for it)
            with self._keywords_named(None if vector else _gymnasium_entry(env_id)):
                if vector:
                    return gymnasium.make_vec(env_id, **self._vector_kwargs(env_id))
                return gymnasium.make(env_id, **self.kwargs)
        except DependencyNotInstalled as error:
            raise EnvSourceError(f"env {self.name!r} needs a package that is not installed: "
                                 f"{_first_line(error)}") from None
        except Error as error:   # unknown id, version, namespace: Gymnasium's own message
            raise EnvSourceError(f"env {self.name!r}: {_first_line(error)}") \
                from None

    def _vector_kwargs(self, env_id: str) -> dict:
        """make_vec's arguments for gym-vec:ID: the user's, asking for same-step
        auto-reset (through vector_kwargs for the sync and async modes, as an argument
        of an env's own vector entry point where it takes one), and env.wrappers on each
        env (sync and async modes only: make_vec refuses them with an entry point)."""
        import inspect
        from functools import partial
        import gymnasium
        from gymnasium.vector import AutoresetMode
        kwargs = dict(self.kwargs)
        spec = gymnasium.spec(env_id)
        mode = kwargs.get("vectorization_mode") or (
            "vector_entry_point" if spec.vector_entry_point is not None else "sync")
        mode = getattr(mode, "value", mode)
        if mode == "vector_entry_point":
            if self.wrappers:
                raise EnvSourceError(f"env {self.name!r}: env.wrappers wrap each env of a sync "
                                     f"or async vector env; {env_id}'s own vector env takes "
                                     f"none (set env.vectorization_mode = \"sync\" to use them)")
            entry = spec.vector_entry_point
            if isinstance(entry, str):
                module, _, attribute = entry.partition(":")
                entry = _resolve_attribute(module, attribute, self.name)
            try:
                takes_mode = "autoreset_mode" in inspect.signature(entry).parameters
            except (TypeError, ValueError):
                takes_mode = False
            if takes_mode:
                kwargs.setdefault("autoreset_mode", AutoresetMode.SAME_STEP)
        else:
            vector_kwargs = dict(kwargs.pop("vector_kwargs", None) or {})
            vector_kwargs.setdefault("autoreset_mode", AutoresetMode.SAME_STEP)
            kwargs["vector_kwargs"] = vector_kwargs
            if self.wrappers:
                kwargs["wrappers"] = [partial(cls, **arguments) for cls, arguments in
                                      map(resolve_wrapper, self.wrappers)]
        return kwargs


__all__ = ["EnvFactory", "EnvSourceError", "EnvKeywordError", "kind_of", "is_native_name",
           "callable_path", "recorded_name", "resolve_wrapper", "check_wrappers",
           "CALLABLE_PREFIX", "GYM_PREFIX", "GYM_VECTOR_PREFIX", "PETTINGZOO_PREFIX"]
