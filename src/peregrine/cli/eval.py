"""`peregrine eval ENV --policy P --episodes N --seed S`: mean ± std of every statistic.

P is a scripted policy name ("random" for every env; drone_swarm adds
"lawnmower" and "voronoi", prospector "trader") or a checkpoint path. See peregrine.evaluate for
how episodes are counted.

The world: a checkpoint is evaluated in the env config it was trained with;
`--preset NAME` evaluates in that preset instead, and `--env.KEY VALUE` (as
for `peregrine train`) overrides single fields of either. The header says
which world ran.
"""
from __future__ import annotations

import json
import time


def add_arguments(parser):
    parser.add_argument("env", nargs="?", default=None,
                        help="env name: native (see `peregrine envs`), gym:ID, pettingzoo:MODULE "
                             "or module:function; omit it with a checkpoint to use the env it "
                             "was trained on")
    parser.add_argument("--policy", "--checkpoint", dest="policy", default="random",
                        help="scripted policy name (random, or the env's own: drone_swarm has "
                             "lawnmower, voronoi; prospector has trader) or a checkpoint file / "
                             "run directory")
    parser.add_argument("--episodes", type=int, default=64, help="complete episodes to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", action="store_true",
                        help="a checkpoint's policy samples its actions (seeded by --seed) "
                             "instead of taking the most likely one")
    add_world_arguments(parser)
    parser.add_argument("--num-envs", type=int, default=None,
                        help="instances stepped at once (default: min(episodes, 1024))")
    parser.add_argument("--threads", type=int, default=1, help="C step threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_world_arguments(parser) -> None:
    parser.add_argument("--preset", default=None,
                        help="env preset (see `peregrine envs ENV`); default: a checkpoint's own "
                             "env config, else the default preset")
    parser.epilog = ("Env overrides: --env.KEY VALUE (or --env.KEY=VALUE) sets one config field, "
                     "as for `peregrine train`.")


def parse_arguments(parser, argv):
    """--env.KEY VALUE tokens are taken out before argparse sees the rest (as train does)."""
    from ..train.config import split_overrides
    rest, tokens = split_overrides(list(argv))
    namespace = parser.parse_args(rest)
    namespace.env_tokens = tokens
    return namespace


def world_overrides(args) -> tuple[str | None, dict]:
    """(preset, {field: value}) from --preset and the --env.KEY VALUE tokens, checked by name."""
    from ..train.config import convert_env_value, parse_override_tokens
    preset, fields = args.preset, {}
    for key, value in parse_override_tokens(getattr(args, "env_tokens", None) or []):
        section, _, name = key.partition(".")
        if section != "env":
            raise ValueError(f"only env overrides (--env.KEY VALUE) apply here, got --{key}")
        name = name.replace("-", "_")
        if name == "name":
            raise ValueError("--env.name cannot be overridden; the env is the ENV argument")
        value = convert_env_value(args.env, name, value, text=True)   # command-line text
        if name == "preset":
            preset = value
        else:
            fields[name] = value
    return preset, fields


def run(args) -> int:
    from ..evaluate import checkpoint_env_name, evaluate
    if args.env is None:
        args.env = checkpoint_env_name(args.policy)
    preset, fields = world_overrides(args)
    start = time.perf_counter()
    result = evaluate(args.env, args.policy, episodes=args.episodes, seed=args.seed,
                      preset=preset, num_envs=args.num_envs, num_threads=args.threads,
                      sample=args.sample, **fields)
    result["seconds"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['env']}, policy {result['policy']}"
          f"{' (sampled actions)' if args.sample else ''}: "
          f"{result['episodes']} episodes, seed {result['seed']}, {result['seconds']:.1f} s")
    print(f"  world: {result['world']}")
    width = max(len(name) for name in result["mean"])
    for name, mean in result["mean"].items():
        print(f"  {name:<{width}} : {mean:12.4f} ± {result['std'][name]:.4f}")
    return 0
