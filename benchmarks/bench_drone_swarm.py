"""DroneSwarm throughput, side by side in one run.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_drone_swarm.py [--seconds 2] [--json out.json]

Figures are drone steps per second (one agent row = one drone; 8 per instance
by default): the C batch at 1 and 2 threads (4096 instances, uniform random
actions drawn before the timed region and cycled), the NumPy reference
(peregrine/envs/drone_swarm/reference.py) in the same run, and the cost of one
instance step by phase. The phase split comes from a second build of the same
header with -DDS_PROFILE (rdtsc around each phase, one thread), made in a
temporary directory; the rdtsc reads themselves add a few percent.

Besides wall-clock steps/s over the whole run, each row shows steps per
CPU-second of this process (time.process_time) and the rate of the fastest
single step call (one step of all instances, about a millisecond: short
enough that some calls run while no other job holds the CPUs). Both move less
than the wall figure when other jobs share the machine. Quote ratios within
one run.
"""
import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from peregrine.envs.drone_swarm import DroneSwarm  # noqa: E402
from peregrine.envs.drone_swarm.reference import DroneSwarmReference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("movement", "connectivity", "confirmation_delivery", "detections",
          "rewards_observations", "end_reset")


def action_pool(rows, count=16, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (rows, 3)).astype(np.float32) for _ in range(count)]


def timed(step, actions, seconds):
    """Steps per wall second, per CPU second, and in the fastest window of
    len(actions) steps (the rate when no other job took the CPUs)."""
    for batch in actions[:4]:
        step(batch)
    steps, wall, cpu = 0, time.perf_counter(), time.process_time()
    best = float("inf")
    while time.perf_counter() - wall < seconds:
        for batch in actions:
            window = time.perf_counter()
            step(batch)
            best = min(best, time.perf_counter() - window)
        steps += len(actions)
    return (steps / (time.perf_counter() - wall), steps / (time.process_time() - cpu), 1 / best)


def bench_c(env_class, num_envs, threads, seconds, **config):
    env = env_class(num_envs=num_envs, seed=0, num_threads=threads, **config)
    try:
        rates = timed(env.step, action_pool(env.num_agents), seconds)
        return tuple(rate * env.num_agents for rate in rates)
    finally:
        env.close()


def bench_numpy(num_envs, seconds, **config):
    env = DroneSwarmReference(num_envs=num_envs, seed=0, **config)
    rates = timed(env.step, action_pool(env.num_agents, 4), seconds)
    return tuple(rate * env.num_agents for rate in rates)


def profiled_module(build_dir):
    """Builds drone_swarm with -DDS_PROFILE into build_dir and imports it."""
    env = dict(os.environ, CFLAGS="-DDS_PROFILE", PEREGRINE_ENVS="drone_swarm")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", build_dir,
                    "--build-temp", os.path.join(build_dir, "tmp")], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    path = next(Path(build_dir).rglob("_drone_swarm*.so"))
    spec = importlib.util.spec_from_file_location("_drone_swarm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_phases(num_envs, seconds):
    with tempfile.TemporaryDirectory() as build_dir:
        module = profiled_module(build_dir)

        class Profiled(DroneSwarm):
            native_module = module

        out = os.path.join(build_dir, "phases.jsonl")
        os.environ["PEREGRINE_DS_PROFILE"] = out
        try:
            wall, cpu, _ = bench_c(Profiled, num_envs, 1, seconds)  # written when the batch is freed
        finally:
            del os.environ["PEREGRINE_DS_PROFILE"]
        row = json.loads(Path(out).read_text().splitlines()[-1])
    steps = row["steps"]
    mean = {phase: row[phase] / steps for phase in PHASES}
    fastest = {phase: row[f"fastest_{phase}"] for phase in PHASES}
    return mean, fastest, wall, cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--numpy-envs", type=int, default=1024)
    parser.add_argument("--json")
    args = parser.parse_args()

    rows = []
    numpy_rates = bench_numpy(args.numpy_envs, args.seconds)
    rows.append(("NumPy reference", args.numpy_envs, *numpy_rates))
    for threads in (1, 2):
        rates = bench_c(DroneSwarm, args.num_envs, threads, args.seconds)
        rows.append((f"C, {threads} thread(s)", args.num_envs, *rates))
    for label, config in (("C, 1 thread, n_drones=64 n_victims=128", {"n_drones": 64, "n_victims": 128}),
                          ("C, 1 thread, preset many_victims", {"n_victims": 30})):
        rates = bench_c(DroneSwarm, args.num_envs // 8, 1, args.seconds, **config)
        rows.append((label, args.num_envs // 8, *rates))
    cycles, fastest, prof_wall, prof_cpu = bench_phases(args.num_envs, args.seconds)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"load average {load:.1f} at the end")
    numpy_wall = numpy_rates[0]
    print(f"{'implementation':42s} {'envs':>6s} {'drone steps/s':>15s} {'per CPU-s':>14s} "
          f"{'best step':>14s} {'vs NumPy':>9s}")
    for name, envs, wall, cpu, best in rows:
        print(f"{name:42s} {envs:6d} {wall:15,.0f} {cpu:14,.0f} {best:14,.0f} {wall / numpy_wall:8.1f}x")
    total, fastest_total = sum(cycles.values()), sum(fastest.values())
    print(f"\nTSC cycles per instance step (8 drones), 1 thread, -DDS_PROFILE build "
          f"({prof_wall:,.0f} drone steps/s); mean over the run and the fastest step call:")
    print(f"  {'phase':24s} {'mean':>8s} {'share':>6s} {'fastest step':>13s} {'share':>6s}")
    for phase in PHASES:
        print(f"  {phase:24s} {cycles[phase]:8,.0f} {100 * cycles[phase] / total:5.1f}% "
              f"{fastest[phase]:13,.0f} {100 * fastest[phase] / fastest_total:5.1f}%")
    print(f"  {'total':24s} {total:8,.0f}        {fastest_total:13,.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [dict(zip(("name", "num_envs", "drone_steps_per_sec",
                                          "drone_steps_per_cpu_sec", "best_step_drone_steps_per_sec"),
                                         r)) for r in rows],
                       "phase_cycles_per_instance_step": cycles,
                       "phase_cycles_fastest_step": fastest, "load_average": load}, f, indent=2)


if __name__ == "__main__":
    main()
