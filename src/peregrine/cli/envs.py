"""`peregrine envs`: every registered env with its spaces and agents per env.

`peregrine envs [NAME] --gpu-check` compiles the env headers for the GPU with
NVRTC (to PTX; no GPU needed) and exits non-zero, naming the env and printing
the compiler's message, if any header does not compile.
"""
from __future__ import annotations

import json

from ..envs.registry import env_class, list_envs


def describe(name: str) -> dict:
    env = env_class(name)(num_envs=1, seed=0)
    try:
        fields = env.config_fields()
        return {
            "name": name,
            "agents_per_env": env.agents_per_env,
            "observation_space": repr(env.single_observation_space),
            "action_space": repr(env.single_action_space),
            "episode_stats": list(env.stat_names),
            "presets": sorted(env.presets),
            "config": {n: d for n, d, *_ in fields},
            # each field's [low, high] and whether it is an integer, as the env checks them
            "bounds": {n: [low, high, bool(integer)] for n, _, low, high, integer in fields},
        }
    finally:
        env.close()


def add_arguments(parser):
    parser.add_argument("name", nargs="?", help="show one env in full (config fields too)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--gpu-check", action="store_true",
                        help="compile the env headers for the GPU with NVRTC (no GPU needed)")


def gpu_check(names) -> int:
    """NVRTC compiles each env's header (built-in, plugin or loaded: its class's
    gpu_source), then the audits the GPU batch relies on: the Env struct has the same
    layout on host and GPU, and every pointer in it is one the GPU batch mirrors."""
    import sys

    from ..envs.gpu import audit
    from ..envs.gpu import compiler as gpu
    sources = {name: env_class(name).gpu_source() for name in names}
    try:
        results = gpu.check_all(sources)
    except ImportError as error:
        print(f"peregrine envs --gpu-check: {error}", file=sys.stderr)
        return 2
    failed = False
    for name, error in results.items():
        if error is not None:
            print(f"{name}: FAILED\n{error}", file=sys.stderr)
            failed = True
            continue
        try:
            layout = audit.check_layout(sources[name])
            problems = layout.mismatches + audit.pointer_problems(sources[name],
                                                                  env_class(name))
        except audit.LayoutToolMissing as missing:
            print(f"{name}: compiles for the GPU; layout and pointer audits skipped: {missing}")
            continue
        if problems:
            print(f"{name}: FAILED the GPU audits\n  " + "\n  ".join(problems), file=sys.stderr)
            failed = True
        else:
            print(f"{name}: compiles for the GPU (NVRTC "
                  f"{'.'.join(map(str, gpu.nvrtc_version()))}, {gpu.CHECK_ARCH}); Env layout "
                  f"identical on host and GPU ({layout.size} bytes), every pointer mirrored")
    return 1 if failed else 0


def run(args) -> int:
    names = [args.name] if args.name else list_envs()
    if args.gpu_check:
        return gpu_check(names)
    rows = [describe(n) for n in names]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"{row['name']}")
        print(f"  agents per env : {row['agents_per_env']}")
        print(f"  observation    : {row['observation_space']}")
        print(f"  action         : {row['action_space']}")
        print(f"  episode stats  : {', '.join(row['episode_stats'])}")
        if args.name:
            print(f"  presets        : {', '.join(row['presets'])}")
            width = max(map(len, row["config"]), default=0)
            for field, default in row["config"].items():
                low, high, integer = row["bounds"][field]
                print(f"    {field:<{width}} = {default:<8g} {'int' if integer else 'float'} "
                      f"in [{low:g}, {high:g}]")
    return 0
