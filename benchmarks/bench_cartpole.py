"""CartPole throughput, side by side in one run.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_cartpole.py [--seconds 3] [--json out.json]

Peregrine's C batch at 1 and 2 threads, the NumPy-vectorized reference
(peregrine/envs/cartpole/reference.py) and Gymnasium's SyncVectorEnv over
CartPole-v1. Random actions are drawn before the timed region and cycled.
Figures are agent steps per second; ratios are against the NumPy version
measured in the same run.
"""
import argparse
import json
import os
import platform
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gymnasium  # noqa: E402
import numpy as np  # noqa: E402

from peregrine.profile.bench import measure  # noqa: E402
from peregrine.envs.cartpole.reference import CartPoleReference  # noqa: E402


def timed_loop(step, actions, seconds):
    for batch in actions[:4]:
        step(batch)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for batch in actions:
            step(batch)
        steps += len(actions)
    return steps / (time.perf_counter() - start)


def bench_numpy(num_envs, seconds):
    env = CartPoleReference(num_envs, seed=0)
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, num_envs).astype(np.int32) for _ in range(16)]
    return timed_loop(env.step, actions, seconds) * num_envs


def bench_gymnasium_sync(num_envs, seconds):
    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * num_envs)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, num_envs) for _ in range(16)]
    try:
        return timed_loop(envs.step, actions, seconds) * num_envs
    finally:
        envs.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--num-envs", type=int, default=8192)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    numpy_sps = bench_numpy(args.num_envs, args.seconds)
    rows.append(("NumPy reference (vectorized)", args.num_envs, 1, numpy_sps))
    rows.append(("Gymnasium SyncVectorEnv", 256, 1, bench_gymnasium_sync(256, args.seconds)))
    for threads in (1, 2):
        result = measure("cartpole", args.num_envs, threads, args.seconds)
        rows.append((f"Peregrine C, {threads} thread(s)", args.num_envs, threads,
                     result["agent_steps_per_sec"]))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
    print(f"{'implementation':34s} {'envs':>6s} {'steps/s':>15s} {'vs NumPy':>9s}")
    for name, envs, _threads, sps in rows:
        print(f"{name:34s} {envs:6d} {sps:15,.0f} {sps / numpy_sps:8.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(zip(("name", "num_envs", "threads", "steps_per_sec"), r)) for r in rows], f, indent=2)


if __name__ == "__main__":
    main()
