"""Compiling the env headers for the GPU with NVRTC, and the CUDA kernels.

An env's rules live once, in its C header. The CPU batch is that header built
by the C compiler (binding.h); the GPU batch is the *same header* built here by
NVRTC, with `native/pg_gpu.h` adding two kernels (step, reset) that run one
GPU thread per instance. NVRTC ships as a pip wheel and needs no GPU to
compile, so `compile_env(name, "ptx")` runs anywhere the `cuda` extra is
installed: the test suite and `peregrine envs --gpu-check` use it to keep every
header compiling for the GPU.

Why NVIDIA's `cuda-bindings` (the `cuda` extra: `pip install peregrine-rl[cuda]`):
it is NVIDIA's own thin binding of NVRTC and the driver API, versioned with the
CUDA toolkit, and it needs nothing else (CuPy would bring a second array
library beside torch). NVRTC comes from the `nvidia-cuda-nvrtc` wheel.

Bit-identity with the CPU build: no fused multiply-adds (`--fmad=false`, as the
CPU build's `-ffp-contract=off`), IEEE division and square root
(`--prec-div=true --prec-sqrt=true`), denormals kept (`--ftz=false`); the
headers use only correctly rounded operations and `pg_math.h`.

Compiled code is cached per (env, target architecture, NVRTC version, hash of
every header and the options) in `$PEREGRINE_CACHE` or
`~/.cache/peregrine/cuda`.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ...files import written_atomically
from .. import sdk

ENVS_DIR = sdk.ENVS_DIR        # module globals, so a test can point them at a copy
NATIVE_DIR = sdk.NATIVE_DIR
OPTIONS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false", "-std=c++17")
# An architecture every NVRTC of CUDA 12 and 13 accepts, for the GPU-less check.
CHECK_ARCH = "compute_90"

INSTALL_HINT = ("the GPU path needs NVIDIA's NVRTC and driver bindings: "
                "pip install 'peregrine-rl[cuda]' (cuda-bindings and nvidia-cuda-nvrtc)")


class GpuCompileError(RuntimeError):
    """NVRTC refused an env header; the message holds the compiler's log."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        raise ImportError(INSTALL_HINT) from error
    return nvrtc


def _check(result, what: str):
    """cuda-bindings return (status, *values): raise on a non-success status."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise RuntimeError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


def nvrtc_version() -> tuple[int, int]:
    return tuple(_check(_nvrtc().nvrtcVersion(), "nvrtcVersion"))


def header_path(env) -> Path:
    """The header of `env`: a built-in env's name (src/peregrine/envs/NAME/NAME.h) or
    the path of any env header (a plugin's, or one built by peregrine.envs.load: a
    NativeEnv class's `gpu_source()` gives one or the other)."""
    path = Path(env) if isinstance(env, os.PathLike) else ENVS_DIR / env / f"{env}.h"
    if not path.is_file():
        raise ValueError(f"no C header for env {str(env)!r} at {path}")
    return path


def header_include(env) -> str:
    """The #include line of `env`'s header (its folder is on the include path)."""
    return f'#include "{header_path(env).name}"'


def label(env) -> str:
    """A short name of `env` for file names and messages: the header's stem."""
    return header_path(env).stem


def header_names() -> list[str]:
    """Every env with a C header (NAME/NAME.h under envs/), sorted."""
    return sorted(path.parent.name for path in ENVS_DIR.glob("*/*.h")
                  if path.stem == path.parent.name)


def kernel_source(name: str) -> str:
    """The whole GPU translation unit: the env header, then the kernels."""
    return f'{header_include(name)}\n#include "pg_gpu.h"\n'


def _include_dirs(name: str) -> list[Path]:
    return sdk.include_dirs(header_path(name), NATIVE_DIR, ENVS_DIR)


def source_digest(name: str, arch: str) -> str:
    """Hash of everything the compiled code depends on."""
    digest = hashlib.sha256()
    digest.update(kernel_source(name).encode())
    digest.update(" ".join((arch, *OPTIONS)).encode())
    digest.update(repr(nvrtc_version()).encode())
    for header in sorted({*ENVS_DIR.rglob("*.h"), *header_path(name).parent.glob("*.h")}):
        digest.update(header.as_posix().encode())
        digest.update(header.read_bytes())
    return digest.hexdigest()[:20]


def compile_env(name: str, target: str = "ptx", arch: str = CHECK_ARCH) -> bytes:
    """Compiles env `name`'s header and the kernels with NVRTC.

    target: "ptx" (any `compute_XY` or `sm_XY` arch; needs no GPU) or "cubin"
    (an `sm_XY` arch). Raises GpuCompileError with NVRTC's log on failure.
    """
    return compile_source(name, kernel_source(name), target, arch)[0]


def compile_source(name: str, source: str, target: str = "ptx", arch: str = CHECK_ARCH,
                   extra_options: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """Compiles `source` (a translation unit that includes env `name`'s header)
    with the GPU build's options plus `extra_options` (e.g. "--ptxas-options=-v",
    whose report lands in the log). Returns (code, NVRTC's log)."""
    if target not in ("ptx", "cubin"):
        raise ValueError(f"target must be 'ptx' or 'cubin', got {target!r}")
    header_path(name)
    nvrtc = _nvrtc()
    program = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{label(name)}_gpu.cu".encode(), 0,
                                              [], []),
                     "nvrtcCreateProgram")
    try:
        options = [f"--gpu-architecture={arch}", *OPTIONS, *extra_options,
                   *(f"--include-path={path}" for path in _include_dirs(name))]
        status, = nvrtc.nvrtcCompileProgram(program, len(options),
                                            [o.encode() for o in options])
        log_size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        # NVRTC writes into the buffers it is given: a fresh bytearray each time (a
        # bytes object such as b" " * 1 may be the interpreter's shared singleton).
        log = bytearray(log_size)
        _check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
        log_text = bytes(log).rstrip(b"\x00 ").decode(errors="replace").strip()
        if int(status) != 0:
            raise GpuCompileError(f"NVRTC could not compile the {label(name)} header for the GPU "
                                  f"({arch}):\n{log_text}")
        if target == "ptx":
            size = _check(nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize")
            code = bytearray(size)
            _check(nvrtc.nvrtcGetPTX(program, code), "nvrtcGetPTX")
        else:
            size = _check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
            code = bytearray(size)
            _check(nvrtc.nvrtcGetCUBIN(program, code), "nvrtcGetCUBIN")
        return bytes(code), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(program)


# ---- launch configuration ----------------------------------------------------------
# One thread per instance in 1-D blocks. The CUDA limits every GPU since compute
# capability 3.0 has (the programming guide's "technical specifications" table): at
# most 1024 threads per block, at most 2**31 - 1 blocks in x, and a warp of 32.
THREADS_PER_BLOCK = 128
CUDA_MAX_THREADS_PER_BLOCK = 1024
CUDA_MAX_GRID_X = 2 ** 31 - 1
CUDA_WARP_SIZE = 32
# The kernels index instances with an int (PgBatch.num_envs and env_step's range).
MAX_INSTANCES = 2 ** 31 - 1


def launch_config(num_envs: int, threads_per_block: int = THREADS_PER_BLOCK,
                  kernel_max_threads: int = CUDA_MAX_THREADS_PER_BLOCK) -> tuple[int, int]:
    """(blocks, threads per block) that give every instance of a batch of
    `num_envs` exactly one thread. `kernel_max_threads` is the compiled
    kernel's own ceiling (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: registers can
    lower it below 1024). The kernels compute the thread index in 64 bits and
    return past `num_envs`, so the last block's spare threads do nothing."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or \
            not 1 <= num_envs <= MAX_INSTANCES:
        raise ValueError(f"num_envs must be an int in [1, {MAX_INSTANCES}] (the kernels' "
                         f"instance index is an int), got {num_envs!r}")
    if not (CUDA_WARP_SIZE <= threads_per_block <= CUDA_MAX_THREADS_PER_BLOCK
            and threads_per_block % CUDA_WARP_SIZE == 0):
        raise ValueError(f"threads_per_block must be a multiple of {CUDA_WARP_SIZE} in "
                         f"[{CUDA_WARP_SIZE}, {CUDA_MAX_THREADS_PER_BLOCK}], got "
                         f"{threads_per_block!r}")
    if threads_per_block > kernel_max_threads:
        raise RuntimeError(f"the kernel can run at most {kernel_max_threads} threads per block "
                           f"(its register use), fewer than the {threads_per_block} it is "
                           f"launched with")
    blocks = -(-num_envs // threads_per_block)
    if blocks > CUDA_MAX_GRID_X:             # cannot happen for an int num_envs; kept honest
        raise ValueError(f"{num_envs} instances need {blocks} blocks, over CUDA's "
                         f"{CUDA_MAX_GRID_X}")
    return blocks, threads_per_block


def cache_dir() -> Path:
    root = os.environ.get("PEREGRINE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "peregrine" / "cuda"


def cached_cubin(name: str, arch: str) -> bytes:
    """compile_env(name, "cubin", arch), from the cache when it was built before."""
    path = cache_dir() / f"{label(name)}-{arch}-{source_digest(name, arch)}.cubin"
    if path.exists():
        return path.read_bytes()
    code = compile_env(name, "cubin", arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_atomically(path) as temporary:   # a concurrent reader sees all or nothing
        temporary.write_bytes(code)
    return code


def check_all(names) -> dict[str, str | None]:
    """Compiles the named native envs to PTX: {name: None | error}. `names` is a list of
    built-in names or a dict {name: header path or name}.

    The caller names the envs (`peregrine envs --gpu-check` passes the
    registry's list): the compiler sits below the registry and never asks it."""
    sources = names if isinstance(names, dict) else {name: name for name in names}
    results = {}
    for name, source in sources.items():
        try:
            compile_env(source, "ptx")
            results[name] = None
        except GpuCompileError as error:
            results[name] = str(error)
    return results
