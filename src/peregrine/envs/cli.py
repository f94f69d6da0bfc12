"""`peregrine envs`: every registered env with its spaces and agents per env."""
from __future__ import annotations

import json

from ..registry import env_class, list_envs


def describe(name: str) -> dict:
    env = env_class(name)(num_envs=1, seed=0)
    try:
        return {
            "name": name,
            "agents_per_env": env.agents_per_env,
            "observation_space": repr(env.single_observation_space),
            "action_space": repr(env.single_action_space),
            "episode_stats": list(env.stat_names),
            "presets": sorted(env.presets),
            "config": {n: d for n, d, *_ in env.config_fields()},
        }
    finally:
        env.close()


def add_arguments(parser):
    parser.add_argument("name", nargs="?", help="show one env in full (config fields too)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    names = [args.name] if args.name else list_envs()
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
            for field, default in row["config"].items():
                print(f"    {field} = {default:g}")
    return 0
