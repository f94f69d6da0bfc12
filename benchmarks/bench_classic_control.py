"""Env steps/s of the classic-control envs, with CartPole as the in-run baseline.

Runs `peregrine bench`'s own measurement (peregrine.profile.bench.measure: random
actions pre-generated, one C call per step) for every env and thread count,
interleaved and repeated, and prints the median of each with its ratio to
CartPole's median at the same thread count. On a shared machine the ratios
are the figures to quote; absolute numbers move with the load.

    .venv/bin/python benchmarks/bench_classic_control.py --num-envs 8192 --seconds 1 --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from peregrine.profile.bench import measure  # noqa: E402

ENVS = ["cartpole", "pendulum", "mountain_car", "mountain_car_continuous"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8192)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    samples = {(name, threads): [] for threads in args.threads for name in ENVS}
    for _ in range(args.repeats):
        for threads in args.threads:
            for name in ENVS:
                result = measure(name, args.num_envs, threads, args.seconds)
                samples[name, threads].append(result["env_steps_per_sec"])

    print(f"num_envs={args.num_envs}, {args.repeats} x {args.seconds:g} s per cell, median shown")
    print(f"{'env':<26}{'threads':>8}{'env steps/s':>16}{'vs cartpole':>13}")
    for threads in args.threads:
        baseline = statistics.median(samples["cartpole", threads])
        for name in ENVS:
            median = statistics.median(samples[name, threads])
            print(f"{name:<26}{threads:>8}{median:>16,.0f}{median / baseline:>12.2f}x")


if __name__ == "__main__":
    main()
