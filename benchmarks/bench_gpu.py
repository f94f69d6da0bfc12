"""Env-only throughput on the GPU beside the C batch on every CPU core of the same machine.

    .venv/bin/python benchmarks/bench_gpu.py                          # every env, default sizes
    .venv/bin/python benchmarks/bench_gpu.py --envs cartpole --sizes 4096 1048576 4194304
    .venv/bin/python benchmarks/bench_gpu.py --json out.json
    .venv/bin/python benchmarks/bench_gpu.py --plan cartpole=65536,16777216 --seconds 1

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

`--plan cartpole=65536,1048576 drone_swarm=65536` names the sizes per env (instead of
--envs x --sizes); `--device cpu` times the device class on the CPU in the gpu
column (the acceptance's dry run); `--json` is rewritten after every row, so a run
stopped part-way keeps the rows it measured.
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


def device_memory_used(torch) -> int | None:
    """Bytes in use on the whole CUDA device (cudaMemGetInfo: every process, the CUDA
    context and the kernels' local memory included, which torch's allocator
    statistics do not see); None off CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return total - free


def measure_device(name, num_envs, seconds, torch, device="cuda", memory=None):
    """The device batch on `device`: agent steps/s. `memory`, a dict, receives the
    device's used bytes before the batch is made and after its timed steps."""
    if memory is not None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()          # what earlier rows cached is not this row's
        memory["before"] = device_memory_used(torch)
    env = peregrine.make(name, num_envs=num_envs, seed=0, device=device)
    actions = torch.from_numpy(action_pool(env.host, 1)[0]).to(device)
    sync = torch.cuda.synchronize if env.device.type == "cuda" else (lambda: None)
    calls, elapsed = timed(lambda: env.step(actions), seconds, sync)
    env.check()
    if memory is not None:
        memory["during"] = device_memory_used(torch)
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


def parse_plan(entries) -> list[tuple[str, int]]:
    """["cartpole=4096,65536", ...] -> [("cartpole", 4096), ("cartpole", 65536), ...]."""
    plan = []
    for entry in entries:
        name, _, sizes = entry.partition("=")
        if name not in peregrine.list_envs() or not sizes:
            raise SystemExit(f"--plan entries are NAME=SIZE[,SIZE...] with NAME one of "
                             f"{', '.join(peregrine.list_envs())}; got {entry!r}")
        try:
            plan += [(name, int(size)) for size in sizes.split(",")]
        except ValueError:
            raise SystemExit(f"--plan sizes must be integers, got {entry!r}") from None
    return plan


def write_json(path, rows) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as out:
        json.dump(rows, out, indent=2)
    os.replace(temporary, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=peregrine.list_envs())
    parser.add_argument("--sizes", nargs="+", type=int, default=DEFAULT_SIZES)
    parser.add_argument("--plan", nargs="+", metavar="NAME=SIZES",
                        help="sizes per env, e.g. cartpole=65536,1048576 (replaces --envs and "
                             "--sizes; no cap applies)")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="where the device batch runs (cpu: the dry run of the same code)")
    parser.add_argument("--json", help="also write the rows to this file (after every row)")
    args = parser.parse_args(argv)
    import torch
    on_cuda = args.device == "cuda" and torch.cuda.is_available()
    device_name = torch.cuda.get_device_name(0) if on_cuda else args.device
    if args.plan:
        plan = parse_plan(args.plan)
    else:
        plan = [(name, size) for name in args.envs for size in args.sizes
                if size <= MAX_INSTANCES.get(name, 1 << 22)]
    print(f"device batch on: {device_name}; CPU: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, C batch on {args.threads} threads")
    if args.device == "cuda" and not on_cuda:
        print("no CUDA GPU here: only the cpu rows run", file=sys.stderr)
    rows = []
    print(f"{'env':<24} {'instances':>10} {'cpu steps/s':>14} {'gpu steps/s':>14} {'gpu/cpu':>8} "
          f"{'cpu+copy/s':>14} {'copy/cpu':>8}")
    for name, size in plan:
        row = {"env": name, "instances": size, "device": device_name, "threads": args.threads,
               "cpu": measure(name, size, args.threads, args.seconds)["agent_steps_per_sec"]}
        if on_cuda or args.device == "cpu":
            memory = {}
            row["gpu"] = measure_device(name, size, args.seconds, torch, args.device, memory)
            if memory["before"] is not None:      # device-wide MiB, before and while stepping
                row["memory_before_mib"] = memory["before"] / 2 ** 20
                row["memory_during_mib"] = memory["during"] / 2 ** 20
        if on_cuda:
            row["cpu_copy"] = measure_cpu_copy(name, size, args.seconds, args.threads, torch)
        rows.append(row)
        cells = [name.ljust(24), f"{size:>10}", f"{row['cpu']:>14,.0f}"]
        for key in ("gpu", "cpu_copy"):
            value = row.get(key)
            cells += [f"{value:>14,.0f}" if value else f"{'-':>14}",
                      f"{value / row['cpu']:>7.2f}x" if value else f"{'-':>8}"]
        print(" ".join(cells), flush=True)
        if args.json:
            write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
