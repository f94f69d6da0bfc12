"""The C SDK: building a native env from its header, in a package or at run time.

A native env is one C header (the contract in `native/pg_env.h`; the guide is
docs/c_envs.md) built together with the generic binding `native/binding.h` into
one extension module. Peregrine's own envs and a user's are built the same way:

* in a package (setup.py): `extension("my_env", "my_env/my_env.h",
  module="my_env._my_env")` is the setuptools Extension, with the include folder
  `get_include()` and the build flags below; Peregrine's setup.py uses the same
  function for its built-in envs;
* at run time: `build_module(header, name)` compiles the header with the system C
  compiler into a cache keyed by the hash of the header, the SDK headers and the
  flags (`$PEREGRINE_CACHE/native`, default `~/.cache/peregrine/native`), so a
  second build of the same source is an import, and an edited header is rebuilt.
  (`peregrine.envs.load` wraps it and registers the env.)

This module imports nothing outside the standard library at import time: setup.py
runs it before the package is built.

Flags: -O3 -Wall -Wextra, warnings as errors with PEREGRINE_WERROR=1;
-ffp-contract=off keeps float32 results identical to the NumPy references and the
GPU build (no fused multiply-adds); -fno-math-errno lets sqrtf inline. Opt-in:
PEREGRINE_NATIVE=1 adds -march=native; PEREGRINE_SANITIZE=1 builds with
ASan/UBSan for the sanitizer tests.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parent / "native"
ENVS_DIR = NATIVE_DIR.parent
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")


class NativeBuildError(ValueError):
    """The C compiler refused a header: the message is the compiler's own
    `file:line: message` lines."""


def get_include() -> str:
    """The folder holding the SDK headers (pg_env.h, pg_math.h, pg_gpu.h, binding.h),
    as numpy.get_include()."""
    return str(NATIVE_DIR)


def include_dirs(header: Path, native_dir: Path = NATIVE_DIR,
                 envs_dir: Path = ENVS_DIR) -> list[Path]:
    """Where an env header's #includes are found, for every build of it (the C
    extension, the run-time build, NVRTC, the layout audits): its own folder, the
    SDK, and the envs folder for headers one built-in env borrows from another
    ("../mountain_car/...")."""
    return [Path(header).parent, native_dir, envs_dir]


def compile_args() -> list[str]:
    # An undeclared function is an error, not C89's implicit int: a header without
    # env_step fails here, naming it, not at import as an undefined symbol.
    args = ["-O3", "-Wall", "-Wextra", "-std=c11", "-D_GNU_SOURCE",
            "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden",
            "-Werror=implicit-function-declaration"]
    if os.environ.get("PEREGRINE_WERROR") == "1":
        args.append("-Werror")
    if os.environ.get("PEREGRINE_NATIVE") == "1":
        args.append("-march=native")
    if os.environ.get("PEREGRINE_SANITIZE") == "1":
        args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                 "-fno-sanitize-recover=undefined", "-O1", "-g"]
    return args


def link_args() -> list[str]:
    args = ["-pthread"]
    if os.environ.get("PEREGRINE_SANITIZE") == "1":
        args += ["-fsanitize=address,undefined"]
    return args


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(f"an env name is lower-case letters, digits and underscores, starting "
                         f"with a letter (it names the C module), got {name!r}")
    return name


def binding_source(name: str, header: str) -> str:
    """The extension's whole C file: the env header, then the generic binding."""
    return (f"/* The {name} extension module: the env header plus the generic binding. */\n"
            f"#define ENV_MODULE_IDENT _{name}\n#include \"{header}\"\n#include \"binding.h\"\n")


def extension(name: str, header: str | os.PathLike[str], module: str | None = None,
              sources_dir: str | os.PathLike[str] | None = None, extra_includes=()):
    """The setuptools Extension of env `name` from its header.

    `module`: the extension's import name (default `<name>._<name>`, next to the
    header's package). The C file that includes the header and the binding is
    written beside the header (or into `sources_dir`) as `_<name>.c`."""
    from setuptools import Extension
    check_name(name)
    header = Path(header)
    folder = Path(sources_dir) if sources_dir is not None else header.parent
    source = folder / f"_{name}.c"
    text = binding_source(name, os.path.relpath(header, folder) if folder != header.parent
                          else header.name)
    if not source.exists() or source.read_text() != text:
        source.write_text(text)
    return Extension(module or f"{name}._{name}", sources=[str(source)],
                     include_dirs=[*map(str, include_dirs(header)), *map(str, extra_includes)],
                     depends=sorted({str(header), *map(str, NATIVE_DIR.glob("*.h"))}),
                     extra_compile_args=compile_args(), extra_link_args=link_args(),
                     libraries=["m"])


# ---- the run-time build -------------------------------------------------------------

def cache_dir() -> Path:
    root = os.environ.get("PEREGRINE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "peregrine") / "native"


def compiler() -> str:
    """The system C compiler (CC, else Python's own, else cc/gcc/clang); ValueError
    in one line when there is none."""
    candidates = [os.environ.get("CC"), (sysconfig.get_config_var("CC") or "").split(" ")[0],
                  "cc", "gcc", "clang"]
    for candidate in candidates:
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise NativeBuildError("no C compiler found (set CC, or install gcc or clang): "
                           "peregrine.envs.load builds the header with it")


def source_digest(header: Path, name: str, flags: list[str]) -> str:
    """Hash of everything the built module depends on: the header and every header
    beside it, the SDK headers, the flags, the Python version."""
    digest = hashlib.sha256()
    digest.update(binding_source(name, header.name).encode())
    digest.update(" ".join(flags).encode())
    digest.update(sys.version.encode())
    for path in sorted({*header.parent.glob("*.h"), *NATIVE_DIR.glob("*.h")}):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def build_flags() -> list[str]:
    """The run-time build's flags: Python's own (CFLAGS, CCSHARED: what setuptools
    compiles an extension with, -fwrapv among them) then the SDK's, so a loaded env
    runs the code an installed one does."""
    python = [*(sysconfig.get_config_var("CFLAGS") or "").split(),
              *(sysconfig.get_config_var("CCSHARED") or "-fPIC").split()]
    return [*python, *compile_args(), "-shared"]


def build_module(header: str | os.PathLike[str], name: str, quiet: bool = True):
    """The extension module of `header` built as env `name`: imported from the cache
    when this exact source was built before, else compiled there first.

    Returns (module, built): `built` is False when the cache served it."""
    import importlib.machinery
    import importlib.util
    check_name(name)
    header = Path(header).resolve()
    if not header.is_file():
        raise ValueError(f"no C header at {str(header)!r}")
    flags = build_flags()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    folder = cache_dir() / f"{name}-{source_digest(header, name, flags)}"
    target = folder / f"_{name}{suffix}"
    built = False
    if not target.exists():
        _compile(header, name, folder, target, flags)
        built = True
    module_name = f"peregrine_loaded_envs._{name}_{folder.name.rsplit('-', 1)[1]}"
    if module_name in sys.modules:
        return sys.modules[module_name], built
    loader = importlib.machinery.ExtensionFileLoader(f"_{name}", str(target))
    spec = importlib.util.spec_from_file_location(f"_{name}", target, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[module_name] = module
    return module, built


def _compile(header: Path, name: str, folder: Path, target: Path, flags: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"_{name}.c"
    source.write_text(binding_source(name, str(header)))
    includes = [*include_dirs(header), Path(sysconfig.get_paths()["include"])]
    from ..files import written_atomically      # here: setup.py runs this module alone
    with written_atomically(target) as temporary:      # a concurrent load sees all or nothing
        command = [compiler(), *flags, *(f"-I{path}" for path in includes), str(source),
                   "-o", str(temporary), *link_args(), "-lm"]
        # errors="replace": a header that is not UTF-8 text is quoted back by the compiler
        result = subprocess.run(command, capture_output=True, text=True, errors="replace")
        if result.returncode != 0:
            raise NativeBuildError(_compiler_errors(result.stderr, header) or
                                   f"the C compiler failed on {header}: {result.stderr.strip()}")


def _contract() -> tuple[str, ...]:
    """What pg_env.h's contract asks an env header to define, in its order, read from
    the header's own list ("What an env header must define" up to "Optional"): the
    macros it #defines, the Env struct and the env_ functions."""
    text = (NATIVE_DIR / "pg_env.h").read_text()
    start = text.index("What an env header must define")
    block = text[start:text.index("Optional", start)]
    names = re.findall(r"#define (\w+)\(|typedef struct (\w+) |\b(env_\w+)\(", block)
    return tuple(dict.fromkeys(next(filter(None, found)) for found in names))


CONTRACT = _contract()


def _compiler_errors(stderr: str, header: Path) -> str:
    """The compiler's `file:line:column: error: ...` lines (the user's own file's
    first), without the include chain around them; headed by the contract's names
    the header does not define, when the errors say so (binding.h's #error for a
    missing ENV_CONFIG, "unknown type name 'Env'", "implicit declaration of function
    'env_step'"), since those errors point into the binding, not the header."""
    lines = [line for line in stderr.splitlines() if ": error:" in line or ": fatal error:" in line]
    own = [line for line in lines if line.startswith(str(header))]
    plain = " ".join(lines).replace("\u2018", "'").replace("\u2019", "'")   # gcc's quotes
    missing = [name for name in CONTRACT
               if f"defines no {name}" in plain or f"type name '{name}'" in plain
               or f"function '{name}'" in plain]
    found = "\n".join(own or lines)
    if missing:
        return (f"{header} does not define {', '.join(missing)} (an env header defines "
                f"{', '.join(CONTRACT)}: see pg_env.h, or `peregrine new-env`):\n{found}")
    return found
