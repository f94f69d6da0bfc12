"""Data-parallel scaling: global training SPS and efficiency for 1..N ranks.

    .venv/bin/python benchmarks/bench_distributed.py                        # 1, 2 ranks
    .venv/bin/python benchmarks/bench_distributed.py --ranks 1 2 4 8 --envs drone_swarm
    .venv/bin/python benchmarks/bench_distributed.py --json out.json
    .venv/bin/python benchmarks/bench_distributed.py --envs drone_swarm --set train.precision bf16
    .venv/bin/python benchmarks/bench_distributed.py --independent   # + the machine's ceiling
    .venv/bin/python benchmarks/bench_distributed.py --envs drone_swarm --config fast
    .venv/bin/python benchmarks/bench_distributed.py --backends shm gloo  # both, one run

Each measurement is one real job, `torchrun --standalone --nproc-per-node N -m
peregrine train ENV` (N = 1 is the plain one-process trainer: torchrun with one
rank starts no process group), pinned with `taskset` to N CPUs of N different
physical cores where the machine has them (`rank_cpus`: SMT siblings come only
after every core has one rank), on the
env's shipped config (so `vec.num_envs` and the minibatch are per rank and the
global batch grows with N: weak scaling), trained through all the steps
(`train.stop_return` 0). The N-rank jobs run once per `--backends` entry
(`train.dist_backend`; "auto" is the shared-memory sums on one machine).

SPS is read from the run's metrics.jsonl: global steps between the end of the
first update and the last, over the training seconds between them (rollout +
learning, rank 0's clock; it excludes start-up, the first update's warm-up and
checkpoint writing). Efficiency(N) = SPS(N) / (N x SPS(1)), measured in the same
invocation. Rank 0's mean seconds per update in the rollout (no collective) and
in learning are printed beside it: the per-rank work is the same for every N, so
what grows with N grew from contention for cores or from the collectives.

For N > 1 it also times the gradient all-reduce alone for each backend (the
same N ranks, pinned the same way, one flat float32 buffer the size of the jobs'
policy, as the trainer sends once per gradient step): that time x gradient steps
per update is the collectives' share of an update. With more ranks than free cores the
cores are the limit, not the collectives: quote figures only from a machine
nobody else is using.

`--independent` also runs, for each N > 1, N independent one-process jobs at once
(job i on core i, no process group): their summed SPS over N x SPS(1) is the
ceiling any N-rank job could reach on this machine. The gap between it and the
data-parallel efficiency is what the trainer's collectives and synchronisation
cost; the gap below 1.0 is the machine's own (shared memory bandwidth, caches,
clocks).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from itertools import count
from pathlib import Path

STEPS = {"cartpole": 400_000, "drone_swarm": 2_000_000}


def cpu_topology(cpus) -> dict:
    """CPU -> (package, core) from /sys/devices/system/cpu; ("cpu", n) where unknown."""
    topology = {}
    for cpu in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            topology[cpu] = (int((base / "physical_package_id").read_text()),
                             int((base / "core_id").read_text()))
        except (OSError, ValueError):
            topology[cpu] = ("cpu", cpu)
    return topology


def rank_cpus(topology=None, allowed=None) -> list[int]:
    """This process's CPUs in the order ranks take them: one CPU of every physical
    core first (cores in order), then the cores' second hardware threads, and so on,
    so N ranks run on N physical cores where the machine has that many. `allowed`:
    the CPUs (default: this process's affinity); `topology` maps a CPU to its
    (package, core) pair, by default read from /sys/devices/system/cpu (a CPU
    without that file counts as its own core)."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    if topology is None:
        topology = cpu_topology(allowed)
    threads: dict = {}
    for cpu in allowed:
        threads.setdefault(topology.get(cpu, ("cpu", cpu)), []).append(cpu)
    ordered = []
    for level in range(max((len(cpus) for cpus in threads.values()), default=0)):
        ordered += [cpus[level] for cpus in threads.values() if level < len(cpus)]
    return ordered


def cpu_list(ranks: int) -> str:
    """The taskset list for `ranks` ranks (rank_cpus' first `ranks`)."""
    return ",".join(str(cpu) for cpu in rank_cpus()[:ranks])


def job_command(env: str, ranks: int, steps: int, run_dir: Path, cores: str, extra=()) -> list:
    return ["taskset", "-c", cores, sys.executable, "-m", "torch.distributed.run",
            "--standalone", "--nproc-per-node", str(ranks), "-m", "peregrine", "train", env,
            "--detach", "--run-dir", str(run_dir), "--total-steps", str(steps),
            "--train.tensorboard", "false", "--train.checkpoint-interval", "0",
            # a throughput job trains all its steps (CartPole's config stops once solved)
            "--train.stop-return", "0", *extra]


def run_jobs(commands: list) -> None:
    """Runs the jobs at once and waits for all of them."""
    jobs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}) for command in commands]
    for command, job in zip(commands, jobs):
        _out, err = job.communicate()
        if job.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{err[-3000:]}")


def read_run(env: str, ranks: int, run_dir: Path, command: list) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    updates = [r for r in records if "updates" in r]
    if len(updates) < 3:    # the first update is warm-up and is left out
        raise RuntimeError(f"{env} with {ranks} rank(s) ran {len(updates)} update(s); "
                           f"give it more --steps (at least 3 updates)")
    first, last = updates[0], updates[-1]
    seconds = last["elapsed"] - first["elapsed"]
    # Rank 0's mean seconds per update in each phase (after the first update). The
    # per-rank work is the same for every N, so a phase that grows with N grew from
    # contention for cores (the rollout has no collective) or, in "learn", also
    # from the all-reduces.
    timed = updates[1:]
    rollout = sum(r["time_split"]["env"] + r["time_split"]["forward"] for r in timed)
    learn = sum(r["time_split"]["learn"] for r in timed)
    return {"env": env, "ranks": ranks, "updates": last["updates"],
            "global_step": last["global_step"], "world_size": last["world_size"],
            "sps": (last["global_step"] - first["global_step"]) / seconds,
            "rollout_s": rollout / len(timed), "learn_s": learn / len(timed),
            # rank 0's torch.compile seconds (0 when the config does not compile)
            "compile_s": last.get("compile_seconds", 0.0), "command": " ".join(command)}


def measure(env: str, ranks: int, steps: int, workdir: Path, extra=()) -> dict:
    # a fresh run directory per job: several jobs of one rank count (backends, batch
    # shapes) share a workdir, and a run directory that holds a run is refused
    run_dir = next(path for path in (workdir / f"{env}-{ranks}-{index}" for index in count())
                   if not path.exists())
    command = job_command(env, ranks, steps, run_dir, cpu_list(ranks), extra)
    started = time.monotonic()
    run_jobs([command])
    # the whole job, start-up (imports, torchrun, compilation) and checkpoint included
    return {**read_run(env, ranks, run_dir, command), "job_s": time.monotonic() - started}


def measure_independent(env: str, ranks: int, steps: int, workdir: Path, extra=()) -> dict:
    """The machine's ceiling for `ranks` ranks: that many independent one-process jobs at
    once, job i pinned to the CPU rank i would take, no collective. Their summed SPS
    over (ranks x the 1-rank SPS) is the most any data-parallel job could reach here:
    what it loses comes from sharing the machine (memory bandwidth, caches, clocks),
    not from the trainer."""
    dirs = [workdir / f"{env}-independent-{ranks}-{i}" for i in range(ranks)]
    commands = [job_command(env, 1, steps, d, str(cpu), extra)
                for d, cpu in zip(dirs, rank_cpus()[:ranks])]
    run_jobs(commands)
    runs = [read_run(env, 1, d, c) for d, c in zip(dirs, commands)]
    return {"env": env, "ranks": ranks, "independent": True,
            "sps": sum(r["sps"] for r in runs), "per_job_sps": [r["sps"] for r in runs],
            "rollout_s": max(r["rollout_s"] for r in runs),
            "learn_s": max(r["learn_s"] for r in runs), "command": " & ".join(r["command"] for r in runs)}


def policy_size(env: str, config_file=None, sets=()) -> tuple[int, int]:
    """(parameters of the jobs' policy, gradient steps per update per rank): the env's
    shipped config with the same --config and --set the jobs get."""
    import torch
    from peregrine.train import load_config
    from peregrine.train.environment import make_env
    from peregrine.train.policy import Policy
    config = load_config(env, config_file, overrides=[tuple(pair) for pair in sets])
    batch = make_env(config, 0, torch.device("cpu"))
    try:
        policy = Policy(batch.single_observation_space, batch.single_action_space, config.policy)
        rows = int(batch.num_agents)
    finally:
        batch.close()
    t = config.train
    steps = max(1, rows * t.horizon // t.minibatch_size) * t.update_epochs
    return sum(p.numel() for p in policy.parameters()), steps


def time_all_reduce(numel: int, backend: str, repeats: int) -> None:
    """Run by each rank (under torchrun): the mean seconds of one all-reduce of `numel`
    float32 (the trainer's one flat gradient buffer) through the trainer's own
    collectives for `backend`; rank 0 prints it."""
    import time
    from types import SimpleNamespace
    import torch
    from peregrine.train.distributed import DataParallel
    config = SimpleNamespace(
        train=SimpleNamespace(device="cpu", dist_backend=backend, dist_timeout=60.0,
                              normalize_obs=False, normalize_reward=False),
        vec=SimpleNamespace(backend="native", num_workers=1))
    dist = DataParallel(config)
    buffer = torch.zeros(numel)
    for _ in range(20):                 # connections and buffers warmed up
        dist.all_reduce(buffer)
    torch.distributed.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(buffer)
    seconds = (time.perf_counter() - start) / repeats
    if dist.is_main:
        print(json.dumps({"all_reduce_s": seconds, "backend": dist.backend}), flush=True)
    dist.close()


def measure_all_reduce(env: str, ranks: int, backend: str, config_file=None, sets=()) -> dict:
    """The collective's share of an update: all-reduce time x gradient steps."""
    numel, steps = policy_size(env, config_file, sets)
    command = ["taskset", "-c", cpu_list(ranks), sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", str(ranks), __file__,
               "--all-reduce-worker", str(numel), "--backends", backend]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    timed = json.loads(done.stdout.strip().splitlines()[-1])
    return {"parameters": numel, "gradient_steps": steps, "backend": timed["backend"],
            "all_reduce_s": timed["all_reduce_s"], "per_update_s": timed["all_reduce_s"] * steps}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(STEPS), choices=sorted(STEPS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--steps", type=float, help="global steps per job (default per env)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--set", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                        help="a config override for every job, e.g. --set train.precision bf16")
    parser.add_argument("--config", help="a shipped config variant or TOML file for every job "
                        "(peregrine train --config), e.g. --config fast")
    parser.add_argument("--independent", nargs="*", type=int, metavar="N",
                        help="also run N independent 1-rank jobs at once (one per core): the "
                             "machine's ceiling for N ranks without collectives; for the N "
                             "given, or every N > 1 of --ranks when none is")
    parser.add_argument("--backends", nargs="+", default=["auto"],
                        choices=["auto", "shm", "gloo"],
                        help="train.dist_backend of the N-rank jobs, one job per entry")
    parser.add_argument("--no-all-reduce", action="store_true",
                        help="skip timing the all-reduce alone (one more job per N > 1)")
    parser.add_argument("--all-reduce-worker", type=int, metavar="NUMEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.all_reduce_worker:     # this file, started by measure_all_reduce under torchrun
        time_all_reduce(args.all_reduce_worker, args.backends[0], repeats=500)
        return 0
    cores = len(os.sched_getaffinity(0))
    if max(args.ranks) > cores:
        parser.error(f"--ranks {max(args.ranks)} needs that many cores; this machine has {cores}")
    if 1 not in args.ranks:
        parser.error("--ranks must include 1 (the baseline of the efficiency)")
    print(f"# {platform.node()}: {cores} cores (ranks take CPUs {cpu_list(cores)} in that "
          f"order), load average {os.getloadavg()[0]:.2f}; "
          f"python {platform.python_version()}")
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for env in args.envs:
            steps = int(args.steps or STEPS[env])
            baseline = None
            # 1 first (the baseline), then the order given: `--ranks 1 8 2 4` measures
            # 8 second, so a run stopped early keeps the figure that matters most
            for ranks in dict.fromkeys([1, *args.ranks]):
                overrides = [token for key, value in args.set for token in (f"--{key}", value)]
                if args.config:
                    overrides += ["--config", args.config]
                for backend in (["auto"] if ranks == 1 else args.backends):
                    flags = overrides + (["--train.dist-backend", backend] if ranks > 1 else [])
                    result = measure(env, ranks, steps * ranks, Path(workdir), flags)
                    baseline = baseline or result["sps"]
                    result["efficiency"] = result["sps"] / (ranks * baseline)
                    label = ""
                    if ranks > 1:
                        result["backend"] = backend
                        label = f" {backend}"
                    if ranks > 1 and not args.no_all_reduce:
                        result["all_reduce"] = collective = measure_all_reduce(
                            env, ranks, backend, args.config, args.set)
                        print(f"{env:12s} ranks {ranks:2d} {backend:4s}  all-reduce "
                              f"({collective['backend']}) of {collective['parameters']:,} "
                              f"floats {collective['all_reduce_s'] * 1e6:.0f} us x "
                              f"{collective['gradient_steps']} gradient steps = "
                              f"{collective['per_update_s'] * 1e3:.1f} ms per update", flush=True)
                    results.append(result)
                    if args.json:           # after every job: a run stopped early keeps them
                        Path(args.json).write_text(json.dumps(results, indent=2))
                    print(f"{env:12s} ranks {ranks:2d}{label}  {result['sps']:12,.0f} SPS  "
                          f"efficiency {result['efficiency']:.2f}  per update: rollout "
                          f"{result['rollout_s'] * 1e3:.1f} ms, learn {result['learn_s'] * 1e3:.1f} ms  "
                          f"({result['global_step']:,} steps, {result['updates']} updates; job "
                          f"{result['job_s']:.1f} s, compilation {result['compile_s']:.1f} s)",
                          flush=True)
                if ranks > 1 and args.independent is not None and (
                        not args.independent or ranks in args.independent):
                    alone = measure_independent(env, ranks, steps, Path(workdir), overrides)
                    alone["efficiency"] = alone["sps"] / (ranks * baseline)
                    results.append(alone)
                    print(f"{env:12s} {ranks:2d} independent 1-rank jobs  {alone['sps']:12,.0f} SPS "
                          f"(ceiling) efficiency {alone['efficiency']:.2f}  per job "
                          + ", ".join(f"{v:,.0f}" for v in alone["per_job_sps"]), flush=True)
    # Other users' load shows here: on a shared machine it is the figures' error bar.
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
