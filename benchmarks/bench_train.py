"""Training benchmark: CartPole solve time over seeds, training SPS, GAE cost, SB3 beside.

    .venv/bin/python benchmarks/bench_train.py                 # everything (a few minutes)
    .venv/bin/python benchmarks/bench_train.py --seeds 1 2 3 --skip-sb3
    .venv/bin/python benchmarks/bench_train.py --only throughput --json out.json
    .venv/bin/python benchmarks/bench_train.py --only overlap --seeds 1 2 3 4 5
    .venv/bin/python benchmarks/bench_train.py --only split
    .venv/bin/python benchmarks/bench_train.py --only compile

Parts:
  solve       the shipped CartPole config on each seed until the mean return of
              the most recent episodes (at least 20, whole updates) reaches 475:
              steps, training wall time and process CPU time at that point.
  throughput  a throughput-oriented CartPole config (4096 envs, one big-batch
              epoch): training SPS over a fixed number of steps, with the
              env / forward / learn split, and the return it reached.
  gae         GAE as a reverse loop over time with all rows per step: the
              NumPy loop compute_gae uses on CPU against the same loop in
              torch ops (its path on other devices), per call.
  drone_swarm the shipped DroneSwarm config (its budget, or --drone-steps), then 64
              evaluation episodes (seed 0, default preset, deterministic
              actions) beside the scripted baselines, and a learning-curve PNG
              (--plot). Not in the default set: it takes minutes.
  overlap     train.overlap (an actor process collects the next rollout while this
              one learns) against the synchronous trainer, each pinned with
              `taskset -c 0` and `taskset -c 0,1`, in one invocation (the fastest of
              --overlap-repeats back-to-back pairs): training
              SPS, CPU-second SPS and the scaling 1 -> 2 cores, for the CartPole
              throughput config that solves (THROUGHPUT_SOLVES) and the shipped
              DroneSwarm config; then steps to a mean return of 475 (sync vs
              overlap) for the shipped CartPole config on --seeds and for
              THROUGHPUT_SOLVES on two seeds; beside them, two data-parallel
              ranks against one (bench_distributed.py), with the same global
              batch and with the same batch per rank. Not in the default set.
  split       vec.split = 2 (the native batch as two halves stepped alternately, each
              half's env step on a worker thread beside the other half's forward)
              against vec.split = 1, each pinned with `taskset -c 0,1` (and `-c 0`
              with --split-cores 0 0,1), in one invocation (the fastest of
              --split-repeats back-to-back pairs): training SPS, CPU-second SPS and
              the time split (env = seconds waited for env steps, env_hidden = env
              seconds that ran beside the forward) for the CartPole throughput config
              that solves (THROUGHPUT_SOLVES) and the shipped DroneSwarm config;
              --split-device cuda puts the learner on the GPU (C envs feeding it).
              Not in the default set.
  normalisers the cost of train.normalize_obs + normalize_reward per update: process
              CPU milliseconds of the rollout and of the whole update with both off
              and on, on the host path (vec.backend native) and the device path
              (vec.backend device, on train.device), for the shipped CartPole
              config, THROUGHPUT and the shipped DroneSwarm config (the least of
              --normaliser-updates updates x --normaliser-repeats trainers each,
              off and on interleaved). Not in the default set.
  compile     train.compile = true (torch.compile of the rollout step and the minibatch
              loss, train/compiling.py) against eager: first the process CPU
              milliseconds per update of collect / advantages / learn of each, in one
              process; then each pinned with `taskset -c 0` and `taskset -c 0,1`, in
              one invocation (the fastest of --compile-repeats back-to-back eager /
              compiled pairs): training SPS (compile excluded, as in the trainer's own
              SPS), CPU-second SPS, the time split and the compile seconds of every
              compiled run (the first one per env with an empty inductor cache, cold;
              the others reuse its on-disk cache, warm), for the CartPole throughput
              config that solves (THROUGHPUT_SOLVES) and the shipped DroneSwarm
              config. Not in the default set.
  policy-cost what a policy variant of DroneSwarm's shipped config costs
              (--policy-variants: mlp, mlp-global-critic, mlp-deepsets, lstm, and
              mlp-bf16, lstm-bf16 with train.precision bf16, lstm32 and lstm32-bf16
              with policy.lstm_size 32): one trainer each in this process, updates
              alternated (--policy-updates rounds after two warm-up updates each),
              median wall and CPU ms per update and per phase, SPS ratio to the
              first variant. Pin it to one core (`taskset -c 1`) for the "one quiet
              core" ratio. Not in the default set.
  sb3         Stable-Baselines3 PPO with the RL-Zoo CartPole-v1 hyperparameters
              (8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, lambda 0.8,
              linear lr 1e-3 and clip 0.2) on Gymnasium's CartPole-v1, same
              solve criterion over its last 20 episodes, when installed.

"Training time" is the trainer's own rollout + learning time: it excludes
imports, env creation and checkpoint writing. The machine named in the output
may be shared; CPU seconds are given beside wall seconds for that reason.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `peregrine train` does

import numpy as np  # noqa: E402
import torch  # noqa: E402

from peregrine.train.config import load_config, read_toml, resolve_config_file  # noqa: E402
from peregrine.train.advantages import gae_scan  # noqa: E402
from peregrine.train.ppo import Trainer, compute_gae  # noqa: E402


SOLVE_RETURN = 475.0


def torch_gae(rewards, values, dones, last_value, gamma, lam, out):
    """The torch path of compute_gae (used off-CPU: advantages.gae_scan), timed here on CPU."""
    return out.copy_(gae_scan(rewards, values, dones, last_value, gamma, lam))


def variant_overrides(env_name: str, variant: str) -> list:
    """A shipped config variant (configs/<env>-<variant>.toml) as (key, value) overrides."""
    path = resolve_config_file(env_name, variant)
    return [(f"{section}.{key}", value) for section, values in read_toml(path).items()
            if section != "env" for key, value in values.items()]

# Throughput-oriented: 2048 envs x 16 steps per update, one epoch of four
# 8192-sample minibatches, a 32-unit MLP. It still learns (slowly per sample).
THROUGHPUT = [("vec.num_envs", 2048), ("vec.num_threads", 1), ("train.horizon", 16),
              ("train.update_epochs", 1), ("train.minibatch_size", 8192),
              ("train.learning_rate", 1e-2), ("train.torch_threads", 1),
              ("policy.hidden_size", 32)]
# The shipped throughput config that solves, `peregrine train cartpole --config fast`
# (configs/cartpole-fast.toml), as overrides over the shipped cartpole.toml.
THROUGHPUT_SOLVES = variant_overrides("cartpole", "fast")


def make_trainer(config):
    if config.train.overlap:
        from peregrine.train.overlap import OverlapTrainer
        return OverlapTrainer(config)
    return Trainer(config)


class BudgetError(ValueError):
    """A step budget too small to measure: one line, not a traceback."""


def solve_run(seed: int, cap: int, overrides=()) -> dict:
    config = load_config("cartpole", overrides=[("train.seed", seed), ("train.total_steps", cap),
                                                *overrides])
    trainer = make_trainer(config)
    try:
        solved = None
        while not trainer.done:
            record = trainer.update()
            if record["recent_return"] is not None and record["recent_return"] >= SOLVE_RETURN:
                solved = record
                break
        return {"seed": seed, "solved": solved is not None,
                "steps": trainer.global_step, "seconds": trainer.elapsed,
                "cpu_seconds": trainer.cpu_seconds, "sps": trainer.global_step / trainer.elapsed,
                "recent_return": trainer.recent_return()}
    finally:
        trainer.close()


def throughput_run(steps: int, overrides=(), env_name="cartpole", base=THROUGHPUT) -> dict:
    config = load_config(env_name, overrides=[*base, ("train.total_steps", steps), *overrides])
    trainer = make_trainer(config)
    try:
        trainer.update()  # warm-up update, not counted
        if trainer.done:
            raise BudgetError(f"{env_name}: {steps:,} steps end within the warm-up update "
                             f"({trainer.global_step:,} steps), which is not timed: give at "
                             f"least twice that")
        start_steps, start_time, start_cpu = trainer.global_step, trainer.elapsed, trainer.cpu_seconds
        split = {}
        while not trainer.done:
            record = trainer.update()
            for key, value in record["time_split"].items():
                split[key] = split.get(key, 0.0) + value
        seconds = trainer.elapsed - start_time
        # Shares of the busy seconds (env + forward + learn; with overlap these ran in two
        # processes at once, and "wait"/"overlap"/"env_hidden" are shown beside them, not
        # in the sum).
        total = sum(split[key] for key in ("env", "forward", "learn"))
        return {"config": dict(base), "steps": trainer.global_step - start_steps,
                "seconds": seconds, "cpu_seconds": trainer.cpu_seconds - start_cpu,
                "cpu_sps": (trainer.global_step - start_steps) / (trainer.cpu_seconds - start_cpu),
                "sps": (trainer.global_step - start_steps) / seconds,
                "split": {k: v / total for k, v in split.items()},
                "recent_return": trainer.recent_return(),
                "compiled": trainer.compiled, "compile_seconds": trainer.compile_seconds}
    finally:
        trainer.close()


def pinned_throughput(cores: str, env_name: str, steps: int, overrides=()) -> dict:
    """throughput_run with `overrides` in a child process pinned with `taskset -c cores`
    (the overlap actor, spawned by it, and the split env-step thread inherit the
    pinning)."""
    spec = json.dumps({"env": env_name, "steps": steps, "overrides": list(overrides)})
    result = subprocess.run(["taskset", "-c", cores, sys.executable, os.path.abspath(__file__),
                             "--pinned-child", spec], capture_output=True, text=True, check=False)
    if result.returncode == 2:     # the child's one-line refusal (pinned_child)
        raise BudgetError(result.stderr.strip().removeprefix("bench_train: error: "))
    if result.returncode != 0:
        raise RuntimeError(f"pinned run {cores} {spec} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def pinned_child(spec: str) -> None:
    spec = json.loads(spec)
    base = THROUGHPUT_SOLVES if spec["env"] == "cartpole" else []
    run = throughput_run(spec["steps"], [tuple(o) for o in spec["overrides"]], spec["env"], base)
    print(json.dumps(run))


def data_parallel_rows(cartpole_steps: int, drone_steps: int, repeats: int = 1) -> list[dict]:
    """The other way to use two cores: two data-parallel ranks (torchrun; on one machine
    they sum through shared memory, see bench_distributed.py) against one, pinned to
    cores 0 and 0,1 like the rows above. Two ways to give the ranks their batch: the
    same global batch and minibatch as the one rank (each rank half the envs and half
    the minibatch: the same algorithm, less work per gradient step), and the one rank's
    batch on each rank (the global batch and minibatch double: the same work per
    gradient step, the data-parallel scaling of bench_distributed.py)."""
    import tempfile
    from pathlib import Path

    from bench_distributed import measure
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for env_name, steps, base in (("cartpole", cartpole_steps, THROUGHPUT_SOLVES),
                                      ("drone_swarm", drone_steps, [])):
            config = load_config(env_name, overrides=base)
            flags = [f"--{key}={value}" for key, value in base] + ["--train.stop-return=0"]
            halves = [f"--vec.num-envs={config.vec.num_envs // 2}",
                      f"--train.minibatch-size={config.train.minibatch_size // 2}"]

            def jobs():
                return {"1 rank": measure(env_name, 1, steps, Path(workdir), flags),
                        "2 ranks, same global batch": measure(env_name, 2, steps, Path(workdir),
                                                              flags + halves),
                        "2 ranks, same batch per rank": measure(env_name, 2, 2 * steps,
                                                                Path(workdir), flags)}
            sps = {key: run["sps"] for key, run in best_of(repeats, jobs).items()}
            for key in ("2 ranks, same global batch", "2 ranks, same batch per rank"):
                rows.append({"env": env_name, "batch": key[len("2 ranks, "):],
                             "sps_1_rank": sps["1 rank"], "sps_2_ranks": sps[key],
                             "scaling": sps[key] / sps["1 rank"]})
                print(f"overlap part: {env_name} data-parallel, {key[len('2 ranks, '):]}: 1 rank "
                      f"{sps['1 rank']:,.0f} SPS, 2 ranks {sps[key]:,.0f} SPS "
                      f"(x{sps[key] / sps['1 rank']:.2f})", flush=True)
    return rows


def phase_milliseconds(updates: int, phases) -> dict:
    """Process CPU milliseconds per update of each (name, call) of `phases`, called in
    order `updates` times."""
    totals = {name: 0.0 for name, _ in phases}
    for _ in range(updates):
        for name, call in phases:
            start = time.process_time()
            call()
            totals[name] += (time.process_time() - start) * 1000 / updates
    return totals


def cpu_split(env_name: str, updates: int) -> dict:
    """Process CPU milliseconds per update of each half, in one process (so the
    other engineers' load on the machine does not count): the synchronous
    trainer's collect / advantages / learn, and the overlap learner's
    lag-corrected advantages (its extra forward pass). What overlap can hide is
    the collect share; the ideal 2-core speed-up is sync total / learner total."""
    base = THROUGHPUT_SOLVES if env_name == "cartpole" else []
    config = load_config(env_name, overrides=[*base, ("train.total_steps", 10**9)])
    trainer = Trainer(config)
    try:
        trainer.update()
        from peregrine.train.overlap import OverlapTrainer

        def overlap_advantages():
            # The overlap learner's correction on the same rollout (it overwrites values,
            # advantages and returns, which learn() then uses: timing only).
            trainer.last_inputs = [trainer.pipeline.current()] * 2
            OverlapTrainer.advantages(trainer)
        totals = phase_milliseconds(updates, [
            ("collect", trainer.collect), ("advantages", trainer.advantages),
            ("overlap_advantages", overlap_advantages), ("learn", trainer.learn)])
        sync = totals["collect"] + totals["advantages"] + totals["learn"]
        learner = totals["overlap_advantages"] + totals["learn"]
        return {"env": env_name, "samples_per_update": trainer.batch_size,
                "cpu_ms": totals, "ideal_overlap_speedup": sync / learner}
    finally:
        trainer.close()


POLICY_VARIANTS = {
    "mlp": [],
    "mlp-global-critic": [("policy.critic", "global")],
    "mlp-deepsets": [("policy.slot_encoder", "deepsets")],
    "lstm": [("policy.lstm", True)],
    "mlp-bf16": [("train.precision", "bf16")],
    "lstm-bf16": [("policy.lstm", True), ("train.precision", "bf16")],
    "lstm32": [("policy.lstm", True), ("policy.lstm_size", 32)],
    "lstm32-bf16": [("policy.lstm", True), ("policy.lstm_size", 32), ("train.precision", "bf16")],
}


def policy_cost(names, updates: int, warmup: int = 2) -> dict:
    """What each policy variant of DroneSwarm's shipped config costs per update: one
    trainer per variant in this process, `warmup` updates each, then `updates`
    rounds of one update per trainer in turn (a load change on the machine hits
    every variant alike). Per variant the median wall and process-CPU ms of an
    update and of its collect / advantages / learn; `sps_ratio` is the variant's
    median wall SPS over the first variant's."""
    trainers = {}
    try:
        for name in names:
            config = load_config("drone_swarm", overrides=[*POLICY_VARIANTS[name],
                                                           ("train.total_steps", 10 ** 9),
                                                           ("train.seed", 1)])
            trainers[name] = Trainer(config)
            for _ in range(warmup):
                trainers[name].update()
        samples = {name: {"wall": [], "cpu": [], "collect": [], "advantages": [], "learn": []}
                   for name in names}
        for _ in range(updates):
            for name, trainer in trainers.items():
                row = samples[name]
                wall, cpu = time.perf_counter(), time.process_time()
                for phase in ("collect", "advantages", "learn"):
                    start = time.process_time()
                    getattr(trainer, phase)()
                    row[phase].append((time.process_time() - start) * 1000)
                row["wall"].append((time.perf_counter() - wall) * 1000)
                row["cpu"].append((time.process_time() - cpu) * 1000)
        first = names[0]
        out = {"samples_per_update": trainers[first].batch_size, "updates": updates,
               "variants": {}}
        for name in names:
            medians = {key: statistics.median(values) for key, values in samples[name].items()}
            medians["sps_ratio"] = (statistics.median(samples[first]["wall"]) /
                                    medians["wall"])
            medians["cpu_ratio"] = statistics.median(samples[first]["cpu"]) / medians["cpu"]
            out["variants"][name] = medians
            print(f"policy cost {name:18s} wall {medians['wall']:7.1f} ms, CPU "
                  f"{medians['cpu']:7.1f} ms (collect {medians['collect']:.1f}, advantages "
                  f"{medians['advantages']:.1f}, learn {medians['learn']:.1f}); SPS ratio to "
                  f"{first}: wall {medians['sps_ratio']:.3f}, CPU {medians['cpu_ratio']:.3f}",
                  flush=True)
        return out
    finally:
        for trainer in trainers.values():
            trainer.close()


def best_of(repeats: int, measure_pair):
    """The fastest of `repeats` calls of `measure_pair` (a dict of runs keyed by core
    set, measured back to back), per core set: on a shared machine other jobs only
    ever slow a run down, so the fastest is the least disturbed."""
    best: dict = {}
    for _ in range(repeats):
        for key, run in measure_pair().items():
            if key not in best or run["sps"] > best[key]["sps"]:
                best[key] = run
    return best


def overlap_part(seeds, cap: int, cartpole_steps: int, drone_steps: int,
                 repeats: int = 1) -> dict:
    out: dict = {"load_average_before": os.getloadavg(), "throughput": []}
    out["cpu_split"] = [cpu_split("cartpole", 30), cpu_split("drone_swarm", 8)]
    for row in out["cpu_split"]:
        print(f"overlap part: {row['env']} CPU ms per update ({row['samples_per_update']:,} "
              f"samples): { {k: round(v, 2) for k, v in row['cpu_ms'].items()} }; ideal "
              f"overlap speed-up {row['ideal_overlap_speedup']:.2f}", flush=True)
    for env_name, steps in (("cartpole", cartpole_steps), ("drone_swarm", drone_steps)):
        for overlap in (False, True):
            runs = best_of(repeats, lambda: {
                cores: pinned_throughput(cores, env_name, steps, [("train.overlap", overlap)])
                for cores in ("0", "0,1")})
            row = {"env": env_name, "overlap": overlap,
                   **{f"sps_{c}": runs[c]["sps"] for c in runs},
                   **{f"cpu_sps_{c}": runs[c]["cpu_sps"] for c in runs},
                   "scaling": runs["0,1"]["sps"] / runs["0"]["sps"],
                   "split_2_cores": runs["0,1"]["split"], "recent_return": runs["0,1"]["recent_return"]}
            out["throughput"].append(row)
            print(f"overlap part: {env_name} overlap={overlap}: 1 core {row['sps_0']:,.0f} SPS, "
                  f"2 cores {row['sps_0,1']:,.0f} SPS (x{row['scaling']:.2f}); CPU-second SPS "
                  f"{row['cpu_sps_0']:,.0f} / {row['cpu_sps_0,1']:,.0f}; 2-core split "
                  f"{ {k: round(v, 3) for k, v in row['split_2_cores'].items()} }", flush=True)
    out["data_parallel"] = data_parallel_rows(cartpole_steps, drone_steps, repeats)
    out["solve"] = []
    for label, overrides, run_seeds in (("shipped cartpole", [], seeds),
                                        ("THROUGHPUT_SOLVES", THROUGHPUT_SOLVES, seeds[:2])):
        for overlap in (False, True):
            run_cap = cap if not overrides else max(cap, 4_000_000)
            runs = [solve_run(seed, run_cap, [*overrides, ("train.overlap", overlap)])
                    for seed in run_seeds]
            out["solve"].append({"config": label, "overlap": overlap, "runs": runs})
            print(f"overlap part: {label} overlap={overlap}: steps to 475 "
                  f"{[r['steps'] if r['solved'] else None for r in runs]} (cap {run_cap:,}), "
                  f"SPS {[round(r['sps']) for r in runs]}", flush=True)
    out["load_average_after"] = os.getloadavg()
    print(f"overlap part: load average before {out['load_average_before']}, "
          f"after {out['load_average_after']}", flush=True)
    return out


def split_part(cartpole_steps: int, drone_steps: int, repeats: int = 2,
               core_sets=("0,1",), device: str = "cpu") -> dict:
    """vec.split 1 against 2 on the same cores, per env, the learner on `device`
    (see the module docstring)."""
    out: dict = {"load_average_before": os.getloadavg(), "device": device, "rows": []}
    for env_name, steps in (("cartpole", cartpole_steps), ("drone_swarm", drone_steps)):
        for cores in core_sets:
            runs = best_of(repeats, lambda: {
                split: pinned_throughput(cores, env_name, steps,
                                         [("vec.split", split), ("train.device", device)])
                for split in (1, 2)})
            row = {"env": env_name, "cores": cores,
                   **{f"sps_split_{k}": run["sps"] for k, run in runs.items()},
                   **{f"cpu_sps_split_{k}": run["cpu_sps"] for k, run in runs.items()},
                   **{f"split_{k}": run["split"] for k, run in runs.items()},
                   "speedup": runs[2]["sps"] / runs[1]["sps"],
                   "recent_return": {k: run["recent_return"] for k, run in runs.items()}}
            out["rows"].append(row)
            shares = {k: {name: round(v, 3) for name, v in run["split"].items()}
                      for k, run in runs.items()}
            print(f"split part: {env_name} on {device}, taskset -c {cores}: split 1 "
                  f"{row['sps_split_1']:,.0f} SPS, split 2 {row['sps_split_2']:,.0f} SPS "
                  f"(x{row['speedup']:.2f}); "
                  f"CPU-second SPS {row['cpu_sps_split_1']:,.0f} / {row['cpu_sps_split_2']:,.0f}; "
                  f"time shares {shares}", flush=True)
    out["load_average_after"] = os.getloadavg()
    print(f"split part: load average before {out['load_average_before']}, "
          f"after {out['load_average_after']}", flush=True)
    return out


def compile_cpu_split(env_name: str, updates: int) -> dict:
    """Process CPU milliseconds per update of collect / advantages / learn, eager and
    compiled, in one process each after one warm-up update (as cpu_split: other jobs'
    load on the machine does not count), with the compile seconds."""
    base = THROUGHPUT_SOLVES if env_name == "cartpole" else []
    out = {"env": env_name}
    for compile in (False, True):
        config = load_config(env_name, overrides=[*base, ("train.total_steps", 10**9),
                                                  ("train.compile", compile)])
        trainer = Trainer(config)
        try:
            trainer.update()
            out["compiled" if compile else "eager"] = phase_milliseconds(updates, [
                ("collect", trainer.collect), ("advantages", trainer.advantages),
                ("learn", trainer.learn)])
            if compile:
                out["compile_seconds"] = trainer.compile_seconds
        finally:
            trainer.close()
    out["speedup"] = sum(out["eager"].values()) / sum(out["compiled"].values())
    return out


def compile_part(cartpole_steps: int, drone_steps: int, repeats: int = 2,
                 core_sets=("0", "0,1")) -> dict:
    """train.compile false against true on the same cores, per env (see the module
    docstring), after the CPU milliseconds per phase (compile_cpu_split). The children share one fresh inductor cache directory, so each env's
    first compiled run compiles cold and the later ones read that cache."""
    import tempfile
    out: dict = {"load_average_before": os.getloadavg(), "rows": []}
    out["cpu_split"] = [compile_cpu_split("cartpole", 60), compile_cpu_split("drone_swarm", 8)]
    for row in out["cpu_split"]:
        print(f"compile part: {row['env']} CPU ms per update, one process: eager "
              f"{ {k: round(v, 2) for k, v in row['eager'].items()} }, compiled "
              f"{ {k: round(v, 2) for k, v in row['compiled'].items()} } "
              f"(x{row['speedup']:.2f}; compiled in {row['compile_seconds']:.1f} s)", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        for env_name, steps in (("cartpole", cartpole_steps), ("drone_swarm", drone_steps)):
            compile_seconds = []

            def pair(cores):
                runs = {compile: pinned_throughput(cores, env_name, steps,
                                                   [("train.compile", compile)])
                        for compile in (False, True)}
                if not runs[True]["compiled"]:
                    raise RuntimeError("train.compile fell back to eager; see its warning")
                compile_seconds.append(round(runs[True]["compile_seconds"], 2))
                return runs
            for cores in core_sets:
                runs = best_of(repeats, lambda: pair(cores))
                row = {"env": env_name, "cores": cores,
                       "sps_eager": runs[False]["sps"], "sps_compiled": runs[True]["sps"],
                       "cpu_sps_eager": runs[False]["cpu_sps"],
                       "cpu_sps_compiled": runs[True]["cpu_sps"],
                       "speedup": runs[True]["sps"] / runs[False]["sps"],
                       "split_eager": runs[False]["split"], "split_compiled": runs[True]["split"],
                       "compile_seconds": list(compile_seconds)}
                compile_seconds.clear()
                out["rows"].append(row)
                shares = {k: {name: round(v, 3) for name, v in run["split"].items()}
                          for k, run in (("eager", runs[False]), ("compiled", runs[True]))}
                print(f"compile part: {env_name}, taskset -c {cores}: eager "
                      f"{row['sps_eager']:,.0f} SPS, compiled {row['sps_compiled']:,.0f} SPS "
                      f"(x{row['speedup']:.2f}); CPU-second SPS {row['cpu_sps_eager']:,.0f} / "
                      f"{row['cpu_sps_compiled']:,.0f}; compile seconds per compiled run "
                      f"{row['compile_seconds']}; time shares {shares}", flush=True)
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    out["load_average_after"] = os.getloadavg()
    print(f"compile part: load average before {out['load_average_before']}, "
          f"after {out['load_average_after']}", flush=True)
    return out


def gae_timing(shapes=((32, 32), (16, 4096), (128, 4096))) -> list[dict]:
    results = []
    rng = np.random.default_rng(0)
    for T, N in shapes:
        r = rng.normal(size=(T, N)).astype(np.float32)
        v = rng.normal(size=(T, N)).astype(np.float32)
        d = (rng.random((T, N)) < 0.05)
        last = rng.normal(size=N).astype(np.float32)
        tr, tv, td, tl = map(torch.from_numpy, (r, v, d, last))
        out = torch.empty_like(tr)
        timings = {}
        for name, call in (("torch", lambda: torch_gae(tr, tv, td, tl, 0.99, 0.95, out)),
                           ("numpy", lambda: compute_gae(tr, tv, td, tl, 0.99, 0.95, out=out))):
            call()
            repeats = max(5, int(2e6 // (T * N)))
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            timings[name] = (time.perf_counter() - start) / repeats * 1e6
        np.testing.assert_allclose(compute_gae(tr, tv, td, tl, 0.99, 0.95).numpy(),
                                   torch_gae(tr, tv, td, tl, 0.99, 0.95, torch.empty_like(tr)),
                                   rtol=1e-4, atol=1e-4)
        results.append({"horizon": T, "rows": N, "torch_us": timings["torch"],
                        "numpy_us": timings["numpy"]})
    return results


NORMALISED = [("train.normalize_obs", True), ("train.normalize_reward", True)]


def normaliser_cost(backend: str, updates: int, repeats: int) -> list[dict]:
    """Per-update CPU milliseconds with the running normalisers off and on. CPU time
    and the least of many updates: on a shared machine they move least with the
    other load (the wall time of one update also counts waiting for a core)."""
    cases = (("cartpole", "shipped config", []), ("cartpole", "THROUGHPUT", THROUGHPUT),
             ("drone_swarm", "shipped config", []))
    rows = []
    for env_name, label, base in cases:
        least = {}
        for _ in range(repeats):
            for normalised in (False, True):
                config = load_config(env_name, overrides=[
                    *base, ("vec.backend", backend), ("train.torch_threads", 1),
                    ("train.total_steps", 10 ** 12), *(NORMALISED if normalised else [])])
                trainer = Trainer(config)
                try:
                    trainer.update()                     # warm-up, not counted
                    for _ in range(updates):
                        start = time.process_time()
                        trainer.rollout()
                        rolled = time.process_time()
                        trainer.learn()
                        end = time.process_time()
                        for key, seconds in (("rollout", rolled - start), ("update", end - start)):
                            least[normalised, key] = min(least.get((normalised, key), 1e9),
                                                         seconds)
                    samples = trainer.batch_size
                finally:
                    trainer.close()
        rows.append({"backend": backend, "env": env_name, "config": label,
                     "samples_per_update": samples,
                     **{f"{key}_ms_{'on' if on else 'off'}": 1e3 * value
                        for (on, key), value in least.items()}})
    return rows


def sb3_run(seed: int, cap: int) -> dict | None:
    try:
        import gymnasium as gym
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
    except ImportError:
        return None

    def linear(initial):
        return lambda progress: progress * initial

    class SolveCallback(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns: list[float] = []
            self.solved_at = None

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
            if len(self.returns) >= 20 and np.mean(self.returns[-20:]) >= SOLVE_RETURN:
                self.solved_at = self.num_timesteps
                return False
            return True

    env = make_vec_env(lambda: gym.make("CartPole-v1"), n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
                seed=seed, device="cpu", verbose=0)
    callback = SolveCallback()
    start, cpu_start = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=cap, callback=callback)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    steps = callback.solved_at or model.num_timesteps
    env.close()
    return {"seed": seed, "solved": callback.solved_at is not None, "steps": steps,
            "seconds": seconds, "cpu_seconds": cpu, "sps": model.num_timesteps / seconds,
            "recent_return": float(np.mean(callback.returns[-20:])) if callback.returns else None}


def drone_swarm_run(steps: int | None, run_dir: str, plot: str | None, episodes: int = 64) -> dict:
    from peregrine.evaluate import evaluate
    from peregrine.train.run import train
    from peregrine.monitor.plots import episode_bins, read_jsonl
    config = load_config("drone_swarm", overrides=[("train.total_steps", steps)] if steps else [])
    summary = train(config, run_dir)
    results = {"train": summary, "eval": {}}
    for policy in (run_dir, "random", "lawnmower", "voronoi"):
        result = evaluate("drone_swarm", policy, episodes=episodes, seed=0)
        label = "PPO (this run)" if policy == run_dir else policy
        results["eval"][label] = {"mean": result["mean"], "std": result["std"]}
        print(f"drone_swarm eval {label}: delivered {result['mean']['delivered']:.2f} "
              f"+- {result['std']['delivered']:.2f}, success {result['mean']['success']:.3f}, "
              f"length {result['mean']['episode_length']:.0f}", flush=True)
    # Per update only the episodes that ended in it count: the 128 instances'
    # 800-step episodes end together, about every 0.8M agent steps, plus a few
    # early successes between. The curve pools them in half-million-step bins,
    # weighted by episodes, and leaves out bins of fewer than 32 episodes.
    curve = episode_bins(read_jsonl(f"{run_dir}/metrics.jsonl"), "delivered", 500_000, 32)
    results["curve"] = curve
    if plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        figure, axis = plt.subplots(figsize=(6.4, 3.6), dpi=120)
        axis.plot([c[0] / 1e6 for c in curve], [c[1] for c in curve], marker=".",
                  label="PPO (training episodes, per 0.5M steps)")
        axis.scatter([summary["global_step"] / 1e6], [results["eval"]["PPO (this run)"]["mean"]["delivered"]],
                     marker="*", s=80, zorder=3, label=f"PPO final, deterministic ({episodes} episodes)")
        for label, style in (("lawnmower", "--"), ("voronoi", ":"), ("random", "-.")):
            axis.axhline(results["eval"][label]["mean"]["delivered"], linestyle=style, color="grey",
                         label=f"{label} (scripted)" if label != "random" else "random")
        axis.set_xlabel("agent steps (millions)")
        axis.set_ylabel("victims delivered per episode")
        axis.set_title("DroneSwarm (default preset): PPO, shipped config")
        axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(plot)
        print(f"wrote {plot}", flush=True)
    return results


def summarize(runs: list[dict]) -> dict:
    solved = [r for r in runs if r["solved"]]
    out = {"solved": f"{len(solved)}/{len(runs)}"}
    for key in ("steps", "seconds", "cpu_seconds", "sps"):
        values = [r[key] for r in solved] if key != "sps" else [r[key] for r in runs]
        if values:
            out[f"{key}_median"] = statistics.median(values)
            out[f"{key}_max"] = max(values)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--cap", type=int, default=200_000, help="step cap per solve run")
    parser.add_argument("--throughput-steps", type=int, default=4_000_000)
    parser.add_argument("--only", choices=["solve", "throughput", "gae", "sb3", "drone_swarm",
                                           "overlap", "split", "normalisers",
                                           "compile", "policy-cost"], nargs="+")
    parser.add_argument("--policy-variants", nargs="+", choices=sorted(POLICY_VARIANTS),
                        default=["mlp", "lstm"], help="policy-cost part: the first is the "
                        "baseline of the ratios")
    parser.add_argument("--policy-updates", type=int, default=8)
    parser.add_argument("--normaliser-updates", type=int, default=10)
    parser.add_argument("--normaliser-repeats", type=int, default=3)
    parser.add_argument("--overlap-cartpole-steps", type=int, default=8_000_000)
    parser.add_argument("--overlap-drone-steps", type=int, default=2_000_000)
    parser.add_argument("--overlap-repeats", type=int, default=2,
                        help="overlap part: keep the fastest of this many 1-core/2-core pairs")
    parser.add_argument("--split-cartpole-steps", type=int, default=8_000_000)
    parser.add_argument("--split-drone-steps", type=int, default=2_000_000)
    parser.add_argument("--split-repeats", type=int, default=2,
                        help="split part: keep the fastest of this many split 1 / split 2 pairs")
    parser.add_argument("--split-cores", nargs="+", default=["0,1"],
                        help="split part: taskset core lists to measure on")
    parser.add_argument("--split-device", default="cpu", choices=["cpu", "cuda"],
                        help="split part: the learner's device (train.device)")
    parser.add_argument("--compile-cartpole-steps", type=int, default=4_000_000)
    parser.add_argument("--compile-drone-steps", type=int, default=1_000_000)
    parser.add_argument("--compile-repeats", type=int, default=2,
                        help="compile part: keep the fastest of this many eager / compiled pairs")
    parser.add_argument("--pinned-child", help=argparse.SUPPRESS)
    parser.add_argument("--drone-steps", type=int, default=None,
                        help="steps of the drone_swarm part (default: the shipped config's budget)")
    parser.add_argument("--drone-run-dir", default="runs/bench-drone_swarm")
    parser.add_argument("--plot", help="learning-curve PNG for the drone_swarm part")
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--json", help="write all results to this file")
    args = parser.parse_args(argv)
    try:
        if args.pinned_child:
            pinned_child(args.pinned_child)
            return 0
        return measure(args)
    except BudgetError as error:
        print(f"bench_train: error: {error}", file=sys.stderr)
        return 2


def measure(args) -> int:
    parts = set(args.only or ["solve", "throughput", "gae", "sb3"])
    if args.skip_sb3:
        parts.discard("sb3")
    torch.set_num_threads(1)
    results = {"machine": {"processor": platform.processor() or platform.machine(),
                           "cpus": os.cpu_count(), "python": platform.python_version(),
                           "torch": torch.__version__,
                           "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}}
    print(f"# machine: {results['machine']}", flush=True)

    if "solve" in parts:
        runs = []
        for seed in args.seeds:
            run = solve_run(seed, args.cap)
            runs.append(run)
            print(f"peregrine seed {seed}: solved={run['solved']} steps={run['steps']:,} "
                  f"train {run['seconds']:.2f} s wall / {run['cpu_seconds']:.2f} s CPU, "
                  f"{run['sps']:,.0f} SPS", flush=True)
        results["peregrine_solve"] = {"runs": runs, "summary": summarize(runs)}
    if "sb3" in parts:
        runs = []
        for seed in args.seeds:
            run = sb3_run(seed, args.cap)
            if run is None:
                print("sb3: stable-baselines3 not installed; skipped")
                break
            runs.append(run)
            print(f"sb3 seed {seed}: solved={run['solved']} steps={run['steps']:,} "
                  f"train {run['seconds']:.2f} s wall / {run['cpu_seconds']:.2f} s CPU, "
                  f"{run['sps']:,.0f} SPS", flush=True)
        if runs:
            results["sb3_solve"] = {"runs": runs, "summary": summarize(runs)}
    if "throughput" in parts:
        run = throughput_run(args.throughput_steps)
        results["throughput"] = run
        print(f"throughput: {run['sps']:,.0f} SPS wall, {run['steps'] / run['cpu_seconds']:,.0f} "
              f"steps per CPU second, over {run['steps']:,} steps "
              f"({run['seconds']:.2f} s wall, {run['cpu_seconds']:.2f} s CPU), split "
              f"{ {k: round(v, 3) for k, v in run['split'].items()} }, "
              f"recent return {run['recent_return']}", flush=True)
    if "drone_swarm" in parts:
        results["drone_swarm"] = drone_swarm_run(args.drone_steps, args.drone_run_dir, args.plot)
    if "overlap" in parts:
        results["overlap"] = overlap_part(args.seeds, args.cap, args.overlap_cartpole_steps,
                                          args.overlap_drone_steps, args.overlap_repeats)
    if "split" in parts:
        results["split"] = split_part(args.split_cartpole_steps, args.split_drone_steps,
                                      args.split_repeats, args.split_cores, args.split_device)
    if "normalisers" in parts:
        results["normalisers"] = []
        for backend in ("native", "device"):
            for row in normaliser_cost(backend, args.normaliser_updates,
                                       args.normaliser_repeats):
                results["normalisers"].append(row)
                print(f"normalisers {row['backend']:6s} {row['env']} {row['config']} "
                      f"({row['samples_per_update']:,} samples/update): rollout "
                      f"{row['rollout_ms_off']:.2f} -> {row['rollout_ms_on']:.2f} CPU-ms, "
                      f"update {row['update_ms_off']:.2f} -> {row['update_ms_on']:.2f} CPU-ms",
                      flush=True)
    if "compile" in parts:
        results["compile"] = compile_part(args.compile_cartpole_steps, args.compile_drone_steps,
                                          args.compile_repeats)
    if "policy-cost" in parts:
        results["policy_cost"] = policy_cost(args.policy_variants, args.policy_updates)
    if "gae" in parts:
        results["gae"] = gae_timing()
        for row in results["gae"]:
            print(f"gae T={row['horizon']} rows={row['rows']}: torch {row['torch_us']:.0f} us, "
                  f"numpy {row['numpy_us']:.0f} us", flush=True)

    print()
    print("| trainer | solved | median steps | max steps | median train s (wall) "
          "| median CPU s | median SPS |")
    print("|---|---|---|---|---|---|---|")
    for key, label in (("peregrine_solve", "Peregrine PPO, shipped config"),
                       ("sb3_solve", "SB3 PPO, RL-Zoo hyperparameters")):
        if key in results:
            s = results[key]["summary"]
            print(f"| {label} | {s['solved']} | {s.get('steps_median', 0):,.0f} | "
                  f"{s.get('steps_max', 0):,.0f} | {s.get('seconds_median', 0):.2f} | "
                  f"{s.get('cpu_seconds_median', 0):.2f} | {s.get('sps_median', 0):,.0f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
