"""Vectorization benchmarks, in one run (a few seconds each on 2 cores).

    .venv/bin/python benchmarks/bench_vector.py [--seconds S] [--json]

1. Emulated Gymnasium CartPole-v1: Peregrine Multiprocessing (2 workers,
   8 envs each, shared memory) vs gymnasium.vector.AsyncVectorEnv over the
   same 16 envs (one process per env, pipes), plus Serial and Gymnasium's
   SyncVectorEnv for reference.
2. Native CartPole, 4096 envs: native threads (one batch, 2 threads) vs
   Multiprocessing (2 workers x 2048 envs) vs Serial.
3. Per-step overhead of each backend: microseconds per step() of one
   native CartPole instance, minus the native batch's own time.
4. The Gymnasium export over native CartPole, 4096 envs, 1 thread: the
   native step, the same step holding 5% of the instances (what next-step
   autoreset does), gymnasium.make_vec in NextStep and SameStep modes (with
   episode records), and Gymnasium's own vectorized CartPoleVectorEnv.

Throughput is reported as ratios within this run: the machine is shared.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def gym_cartpole():
    import gymnasium
    return gymnasium.make("CartPole-v1")


def _actions(num_rows, steps, dtype=np.int32):
    rng = np.random.default_rng(0)
    return rng.integers(0, 2, (steps, num_rows)).astype(dtype)


def measure_sps(step, num_rows, seconds, reset=None, warmup_steps=20, windows=3,
                dtype=np.int32):
    """(rows per second, seconds per step) of `step(actions)`: the best of
    `windows` windows of seconds/windows each, so a burst of load from other
    jobs on the shared machine costs one window, not the figure."""
    actions = _actions(num_rows, 256, dtype)
    if reset:
        reset()
    for i in range(warmup_steps):
        step(actions[i % 256])
    best, steps = 0.0, 0
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while True:
            for _ in range(16):
                step(actions[steps % 256])
                steps += 1
                count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / windows:
                break
        best = max(best, count / elapsed)
    return best * num_rows, 1.0 / best


def bench_emulated(seconds):
    import gymnasium
    import peregrine.vector as pv
    num_envs, workers = 16, 2
    out = {}
    with pv.make(gym_cartpole, backend="multiprocessing", num_envs=num_envs,
                 num_workers=workers, seed=0) as env:
        # emulated envs keep Gymnasium's int64 Discrete actions
        out["peregrine_multiprocessing"] = measure_sps(env.step, num_envs, seconds, env.reset,
                                                       dtype=np.int64)[0]
    with pv.make(gym_cartpole, backend="serial", num_envs=num_envs, seed=0) as env:
        out["peregrine_serial"] = measure_sps(env.step, num_envs, seconds, env.reset,
                                              dtype=np.int64)[0]
    envs = gymnasium.vector.AsyncVectorEnv([gym_cartpole] * num_envs)
    try:
        out["gymnasium_async"] = measure_sps(lambda a: envs.step(a), num_envs, seconds,
                                             lambda: envs.reset(seed=0))[0]
    finally:
        envs.close()
    envs = gymnasium.vector.SyncVectorEnv([gym_cartpole] * num_envs)
    try:
        out["gymnasium_sync"] = measure_sps(lambda a: envs.step(a), num_envs, seconds,
                                            lambda: envs.reset(seed=0))[0]
    finally:
        envs.close()
    out["ratio_multiprocessing_vs_async"] = (out["peregrine_multiprocessing"]
                                             / out["gymnasium_async"])
    return out


def bench_native(seconds):
    import peregrine.vector as pv
    num_envs = 4096
    out = {}
    configs = {
        "native_1_thread": dict(backend="native", num_threads=1),
        "native_2_threads": dict(backend="native", num_threads=2),
        "serial_2_blocks": dict(backend="serial", num_workers=2),
        "multiprocessing_2_workers": dict(backend="multiprocessing", num_workers=2),
    }
    for label, kwargs in configs.items():
        with pv.make("cartpole", num_envs=num_envs, seed=0, **kwargs) as env:
            out[label] = measure_sps(env.step, num_envs, seconds, env.reset)[0]
    out["ratio_native_threads_vs_multiprocessing"] = (out["native_2_threads"]
                                                      / out["multiprocessing_2_workers"])
    return out


def bench_overhead(seconds):
    import peregrine.vector as pv
    configs = {
        "native": dict(backend="native", num_envs=1),
        "serial": dict(backend="serial", num_envs=1),
        "multiprocessing_1_worker": dict(backend="multiprocessing", num_envs=1, num_workers=1),
        "multiprocessing_2_workers": dict(backend="multiprocessing", num_envs=2, num_workers=2),
    }
    out = {}
    for label, kwargs in configs.items():
        with pv.make("cartpole", seed=0, **kwargs) as env:
            out[label + "_us"] = measure_sps(env.step, env.num_agents, seconds, env.reset)[1] * 1e6
    base = out["native_us"]
    for label in configs:
        out[label + "_overhead_us"] = out[label + "_us"] - base
    return out


def bench_export(seconds):
    import gymnasium
    import peregrine
    num_envs = 4096
    out = {}
    with peregrine.make("cartpole", num_envs=num_envs, seed=0) as env:
        out["native_step"] = measure_sps(env.step, num_envs, seconds, env.reset)[0]
        hold = np.random.default_rng(0).random(num_envs) < 0.05
        out["native_step_holding_5pct"] = measure_sps(lambda a: env.step(a, hold=hold), num_envs,
                                                      seconds, env.reset)[0]
    for mode in ("NextStep", "SameStep"):
        envs = gymnasium.make_vec("peregrine/CartPole-v1", num_envs=num_envs,
                                  autoreset_mode=mode)
        try:
            out[f"make_vec_{mode}"] = measure_sps(envs.step, num_envs, seconds,
                                                  lambda: envs.reset(seed=0))[0]
        finally:
            envs.close()
    envs = gymnasium.make_vec("CartPole-v1", num_envs=num_envs,
                              vectorization_mode="vector_entry_point")
    try:
        out["gymnasium_cartpole_vector_env"] = measure_sps(
            envs.step, num_envs, seconds, lambda: envs.reset(seed=0), dtype=np.int64)[0]
    finally:
        envs.close()
    out["ratio_make_vec_next_step_vs_gymnasium"] = (out["make_vec_NextStep"]
                                                    / out["gymnasium_cartpole_vector_env"])
    out["ratio_native_vs_make_vec_next_step"] = out["native_step"] / out["make_vec_NextStep"]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = {"cores": len(os.sched_getaffinity(0)),
               "emulated_gymnasium_cartpole_16_envs": bench_emulated(args.seconds),
               "native_cartpole_4096_envs": bench_native(args.seconds),
               "per_step_overhead": bench_overhead(args.seconds),
               "gymnasium_export_cartpole_4096_envs": bench_export(args.seconds)}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"cores: {results['cores']} (shared machine: compare ratios, not absolutes)")
    for section in list(results)[1:]:
        print(f"\n{section}")
        for key, value in results[section].items():
            unit = "" if key.startswith("ratio") or key.endswith("_us") else " steps/s"
            print(f"  {key:45s} {value:14,.2f}{unit}")


if __name__ == "__main__":
    main()
