"""Env-only throughput on the GPU beside the C batch on every CPU core of the same machine.

    .venv/bin/python benchmarks/bench_gpu.py                          # every env, default sizes
    .venv/bin/python benchmarks/bench_gpu.py --envs cartpole --sizes 4096 1048576 4194304
    .venv/bin/python benchmarks/bench_gpu.py --json out.json

For each env and number of instances, in one run:

* gpu: `peregrine.make(name, device="cuda")`, fixed random actions already on the
  device, `step` in a loop, one synchronisation at the end (agent steps/s);
* cpu: the C batch on NumPy buffers with `num_threads` = every core;
* cpu+copy: what a GPU learner must do with a CPU env: the C batch steps, the
  observations go to the GPU through a pinned buffer (non-blocking copy) and the
  actions come back to the host each step.

Ratios are against the cpu row of the same size, measured in the same run. Without a
GPU only the cpu rows run (and the script says so). Actions are sampled once per size:
the figures are the env's, not the sampler's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import peregrine
from peregrine.profile.bench import action_pool, measure

DEFAULT_SIZES = [4096, 65536, 1 << 20, 1 << 22]
# Largest batch per env that keeps every buffer within a few GiB (DroneSwarm has 8 rows
# of 19 floats per instance).
MAX_INSTANCES = {"drone_swarm": 1 << 19, "prospector": 1 << 20}


def timed(step, seconds: float, sync=lambda: None) -> tuple[int, float]:
    """Calls step() until `seconds` pass (after a warm-up); returns (calls, elapsed)."""
    for _ in range(3):
        step()
    sync()
    calls, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            step()
        calls += 10
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls, elapsed


def measure_gpu(name, num_envs, seconds, torch):
    env = peregrine.make(name, num_envs=num_envs, seed=0, device="cuda")
    actions = torch.from_numpy(action_pool(env.host, 1)[0]).cuda()
    calls, elapsed = timed(lambda: env.step(actions), seconds, torch.cuda.synchronize)
    env.check()
    rows = env.num_agents
    env.close()
    return calls * rows / elapsed


def measure_cpu_copy(name, num_envs, seconds, threads, torch):
    """C batch + observations to the GPU (pinned, non-blocking) + actions back."""
    env = peregrine.make(name, num_envs=num_envs, seed=0, num_threads=threads)
    actions_gpu = torch.from_numpy(action_pool(env, 1)[0]).cuda()
    pinned_obs = torch.empty(env.observations.shape, dtype=torch.float32).pin_memory()
    pinned_actions = torch.empty(actions_gpu.shape, dtype=actions_gpu.dtype).pin_memory()
    obs_gpu = torch.empty(env.observations.shape, dtype=torch.float32, device="cuda")
    actions_host = pinned_actions.numpy()

    def step():
        pinned_actions.copy_(actions_gpu)          # waits for the device: the learner's actions
        env.step(actions_host)
        pinned_obs.numpy()[...] = env.observations
        obs_gpu.copy_(pinned_obs, non_blocking=True)

    calls, elapsed = timed(step, seconds, torch.cuda.synchronize)
    rows = env.num_agents
    env.close()
    return calls * rows / elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=peregrine.list_envs())
    parser.add_argument("--sizes", nargs="+", type=int, default=DEFAULT_SIZES)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    import torch
    have_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if have_gpu else "none"
    print(f"GPU: {device}; CPU: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, C batch on {args.threads} threads")
    if not have_gpu:
        print("no CUDA GPU here: only the cpu rows run", file=sys.stderr)
    rows = []
    print(f"{'env':<24} {'instances':>10} {'cpu steps/s':>14} {'gpu steps/s':>14} {'gpu/cpu':>8} "
          f"{'cpu+copy/s':>14} {'copy/cpu':>8}")
    for name in args.envs:
        for size in args.sizes:
            if size > MAX_INSTANCES.get(name, 1 << 22):
                continue
            row = {"env": name, "instances": size, "device": device,
                   "cpu": measure(name, size, args.threads, args.seconds)["agent_steps_per_sec"]}
            if have_gpu:
                row["gpu"] = measure_gpu(name, size, args.seconds, torch)
                row["cpu_copy"] = measure_cpu_copy(name, size, args.seconds, args.threads, torch)
            rows.append(row)
            cells = [name.ljust(24), f"{size:>10}", f"{row['cpu']:>14,.0f}"]
            for key in ("gpu", "cpu_copy"):
                value = row.get(key)
                cells += [f"{value:>14,.0f}" if value else f"{'-':>14}",
                          f"{value / row['cpu']:>7.2f}x" if value else f"{'-':>8}"]
            print(" ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
