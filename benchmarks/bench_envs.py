"""Every registered native env at 1 and 2 threads, as a Markdown table.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_envs.py [--seconds 3] [--num-envs 8192]

Each figure is `peregrine bench`'s measurement (random actions drawn before
the timed region); the best of --repeats windows is kept, which filters out
moments when another process held a core. Agent steps/s = env steps/s x
agents per env.
"""
import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import peregrine  # noqa: E402
from peregrine.profile.bench import measure  # noqa: E402

# Instances per env: heavy envs need fewer for the same step time.
NUM_ENVS = {"drone_swarm": 4096}


def best(name, num_envs, threads, seconds, repeats):
    runs = [measure(name, num_envs, threads, seconds) for _ in range(repeats)]
    return max(runs, key=lambda r: r["agent_steps_per_sec"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--num-envs", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"| env | instances | agents/env | agent steps/s, 1 thread | agent steps/s, 2 threads | 2 vs 1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in peregrine.list_envs():
        num_envs = NUM_ENVS.get(name, args.num_envs)
        one = best(name, num_envs, 1, args.seconds, args.repeats)
        two = best(name, num_envs, 2, args.seconds, args.repeats)
        print(f"| `{name}` | {num_envs} | {one['agents_per_env']} | "
              f"{one['agent_steps_per_sec'] / 1e6:,.1f}M | {two['agent_steps_per_sec'] / 1e6:,.1f}M | "
              f"{two['agent_steps_per_sec'] / one['agent_steps_per_sec']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
