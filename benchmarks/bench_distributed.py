"""Data-parallel scaling: global training SPS and efficiency for 1..N ranks.

    .venv/bin/python benchmarks/bench_distributed.py                        # 1, 2 ranks
    .venv/bin/python benchmarks/bench_distributed.py --ranks 1 2 4 8 --envs drone_swarm
    .venv/bin/python benchmarks/bench_distributed.py --json out.json

Each measurement is one real job, `torchrun --standalone --nproc-per-node N -m
peregrine train ENV` (N = 1 is the plain one-process trainer: torchrun with one
rank starts no process group), pinned with `taskset` to cores 0..N-1, on the
env's shipped config (so `vec.num_envs` and the minibatch are per rank and the
global batch grows with N: weak scaling), gloo on CPU, trained through all the
steps (`train.stop_return` 0).

SPS is read from the run's metrics.jsonl: global steps between the end of the
first update and the last, over the training seconds between them (rollout +
learning, rank 0's clock; it excludes start-up, the first update's warm-up and
checkpoint writing). Efficiency(N) = SPS(N) / (N x SPS(1)), measured in the same
invocation. With more ranks than free cores the cores are the limit, not the
collectives: quote figures only from a machine nobody else is using.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

STEPS = {"cartpole": 400_000, "drone_swarm": 2_000_000}


def measure(env: str, ranks: int, steps: int, workdir: Path, extra=()) -> dict:
    run_dir = workdir / f"{env}-{ranks}"
    cores = ",".join(str(c) for c in range(ranks))
    command = ["taskset", "-c", cores, sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), "-m", "peregrine", "train", env,
               "--detach", "--run-dir", str(run_dir), "--total-steps", str(steps),
               "--train.tensorboard", "false", "--train.checkpoint-interval", "0",
               # a throughput job trains all its steps (CartPole's config stops once solved)
               "--train.stop-return", "0", *extra]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    updates = [r for r in records if "updates" in r]
    first, last = updates[0], updates[-1]
    seconds = last["elapsed"] - first["elapsed"]
    return {"env": env, "ranks": ranks, "updates": last["updates"],
            "global_step": last["global_step"], "world_size": last["world_size"],
            "sps": (last["global_step"] - first["global_step"]) / seconds,
            "time_split_last": last["time_split"], "command": " ".join(command)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(STEPS), choices=sorted(STEPS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--steps", type=float, help="global steps per job (default per env)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    if max(args.ranks) > cores:
        parser.error(f"--ranks {max(args.ranks)} needs that many cores; this machine has {cores}")
    if 1 not in args.ranks:
        parser.error("--ranks must include 1 (the baseline of the efficiency)")
    print(f"# {platform.node()}: {cores} cores, load average {os.getloadavg()[0]:.2f}; "
          f"python {platform.python_version()}")
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for env in args.envs:
            steps = int(args.steps or STEPS[env])
            baseline = None
            for ranks in sorted(args.ranks):
                result = measure(env, ranks, steps * ranks, Path(workdir))
                baseline = baseline or result["sps"]
                result["efficiency"] = result["sps"] / (ranks * baseline)
                results.append(result)
                print(f"{env:12s} ranks {ranks:2d}  {result['sps']:12,.0f} SPS  "
                      f"efficiency {result['efficiency']:.2f}  "
                      f"({result['global_step']:,} steps, {result['updates']} updates)",
                      flush=True)
    # Other users' load shows here: on a shared machine it is the figures' error bar.
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
