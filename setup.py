"""Builds one extension module per native env from the generic binding.

Every env lives in src/peregrine/envs/<name>/ with its C header and a
three-line _<name>.c; registering a new env here is one entry in NATIVE_ENVS.

Flags: -O3 -Wall -Wextra, warnings are errors in CI (PEREGRINE_WERROR=1).
-ffp-contract=off keeps float32 results identical to the NumPy references
(no fused multiply-adds); -fno-math-errno lets sqrtf inline. Opt-in:
PEREGRINE_NATIVE=1 adds -march=native; PEREGRINE_SANITIZE=1 builds with
ASan/UBSan for the sanitizer tests. PEREGRINE_ENVS=a,b builds only those envs
(handy while editing one header).
"""
import os
from pathlib import Path

from setuptools import Extension, setup

NATIVE_ENVS = ["cartpole"]
NATIVE_ENVS += ["pendulum", "mountain_car", "mountain_car_continuous"]  # classic control
NATIVE_ENVS += ["prospector"]
NATIVE_ENVS += ["drone_swarm"]

NATIVE_DIR = "src/peregrine/envs/native"


def compile_args():
    args = ["-O3", "-Wall", "-Wextra", "-std=c11", "-D_GNU_SOURCE",
            "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden"]
    if os.environ.get("PEREGRINE_WERROR") == "1":
        args.append("-Werror")
    if os.environ.get("PEREGRINE_NATIVE") == "1":
        args.append("-march=native")
    if os.environ.get("PEREGRINE_SANITIZE") == "1":
        args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                 "-fno-sanitize-recover=undefined", "-O1", "-g"]
    return args


def link_args():
    args = ["-pthread"]
    if os.environ.get("PEREGRINE_SANITIZE") == "1":
        args += ["-fsanitize=address,undefined"]
    return args


def native_extension(name):
    env_dir = f"src/peregrine/envs/{name}"
    return Extension(
        f"peregrine.envs.{name}._{name}",
        sources=[f"{env_dir}/_{name}.c"],
        include_dirs=[NATIVE_DIR, env_dir],
        # every header: an env may include another env's shared header
        depends=sorted(str(p) for p in Path("src/peregrine/envs").rglob("*.h")),
        extra_compile_args=compile_args(),
        extra_link_args=link_args(),
        libraries=["m"],
    )


selected = [n for n in os.environ.get("PEREGRINE_ENVS", "").split(",") if n] or NATIVE_ENVS
setup(ext_modules=[native_extension(name) for name in selected])
