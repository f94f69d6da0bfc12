"""`peregrine eval ENV --policy P --episodes N --seed S`: mean ± std of every statistic.

P is a scripted policy name ("random" for every env; drone_swarm adds
"lawnmower" and "voronoi", prospector "trader") or a checkpoint path. See peregrine.evaluate for
how episodes are counted.
"""
from __future__ import annotations

import json
import time


def add_arguments(parser):
    parser.add_argument("env", help="environment name (see `peregrine envs`)")
    parser.add_argument("--policy", "--checkpoint", dest="policy", default="random",
                        help="scripted policy name (random, or the env's own: drone_swarm has "
                             "lawnmower, voronoi; prospector has trader) or a checkpoint file / "
                             "run directory")
    parser.add_argument("--episodes", type=int, default=64, help="complete episodes to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="default", help="env preset (see `peregrine envs ENV`)")
    parser.add_argument("--num-envs", type=int, default=None,
                        help="instances stepped at once (default: min(episodes, 1024))")
    parser.add_argument("--threads", type=int, default=1, help="C step threads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from .evaluate import evaluate
    start = time.perf_counter()
    result = evaluate(args.env, args.policy, episodes=args.episodes, seed=args.seed,
                      preset=args.preset, num_envs=args.num_envs, num_threads=args.threads)
    result["seconds"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['env']} ({result['preset']}), policy {result['policy']}: "
          f"{result['episodes']} episodes, seed {result['seed']}, {result['seconds']:.1f} s")
    width = max(len(name) for name in result["mean"])
    for name, mean in result["mean"].items():
        print(f"  {name:<{width}} : {mean:12.4f} ± {result['std'][name]:.4f}")
    return 0
