"""`peregrine bench ENV`: env steps/s and agent steps/s of a native batch
(measured by `peregrine.profile.bench.measure`)."""
from __future__ import annotations

import json


def add_arguments(parser):
    parser.add_argument("env")
    parser.add_argument("--num-envs", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")


def run(args) -> int:
    if args.seconds <= 0:
        raise SystemExit("--seconds must be positive")
    from ..profile.bench import measure
    result = measure(args.env, args.num_envs, args.threads, args.seconds, seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['env']}: {result['num_envs']} envs x {result['agents_per_env']} agents, "
              f"{result['num_threads']} thread(s), {result['seconds']:.1f} s")
        print(f"  env steps/s   : {result['env_steps_per_sec']:,.0f}")
        print(f"  agent steps/s : {result['agent_steps_per_sec']:,.0f}")
    return 0
