"""The benchmark suite (pytest-benchmark), system benchmarks. Not part of the test suite.

    .venv/bin/python -m pytest benchmarks/test_bench_system.py --benchmark-only

Categories:

* reference: one step of the NumPy-vectorized CartPole (the library's readable
  reference, envs/cartpole/reference.py), 4096 instances. It does not depend
  on the C envs, vector backends or trainer, so every other figure of a
  session can be read as a multiple of it (benchmarks/baseline.py reports
  these ratios beside the absolute times; they move less with machine load
  than absolute times do). The source hash of the reference is kept in
  extra_info, so a comparison can tell when the reference itself changed.
* multiprocessing_step: one `step()` of native CartPole, 4096 instances,
  through the Multiprocessing backend (2 worker processes, shared memory).
* ppo_update: one full PPO update (rollout, GAE, learning epochs) of every
  shipped throughput config, `src/peregrine/train/configs/<env>-fast.toml`,
  through the trainer's public API; torch.compile (where the config asks for
  it) and a first update run before timing. Configs meant for two ranks
  (DroneSwarm's) are timed for one rank.
* cold_start: a fresh interpreter running `python -m peregrine.cli train
  cartpole` (shipped config, progress every update), timed from process start
  to the first progress line, which the CLI prints after the first update is
  recorded: what a user waits for before the first result.

PEREGRINE_BENCH_TINY=1 shrinks them for the smoke run (suite_common.py).
"""
from __future__ import annotations

import hashlib
import inspect
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from suite_common import TINY, cycling, seconds, tiny_trainer_overrides

import peregrine

REFERENCE_ENVS = 64 if TINY else 4096


# ---- reference ----------------------------------------------------------------------
def test_reference_numpy_cartpole(benchmark):
    from peregrine.envs.cartpole import reference
    env = reference.CartPoleReference(REFERENCE_ENVS, seed=0)
    env.reset(seed=0)
    actions = [np.random.default_rng(i).integers(0, 2, REFERENCE_ENVS).astype(np.int32)
               for i in range(8)]
    benchmark.group = "reference"
    benchmark(cycling(env.step, actions))
    source = inspect.getsource(reference)
    benchmark.extra_info["reference_source_sha256"] = hashlib.sha256(source.encode()).hexdigest()
    benchmark.extra_info["agent_steps_per_sec"] = REFERENCE_ENVS / seconds(benchmark)


# ---- multiprocessing_step -------------------------------------------------------------
def test_multiprocessing_step(benchmark):
    import peregrine.vector as vector
    num_envs = 16 if TINY else 4096
    with vector.make("cartpole", backend="multiprocessing", num_envs=num_envs, num_workers=2,
                     seed=0, overwork=True) as env:
        env.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, num_envs).astype(np.int32)
        benchmark.group = "multiprocessing_step"
        benchmark.extra_info["cores"] = 2      # two workers step at once (baseline.py)
        benchmark(env.step, actions)
        benchmark.extra_info["agent_steps_per_sec"] = num_envs / seconds(benchmark)


# ---- ppo_update ---------------------------------------------------------------------------
def _fast_configs() -> list[str]:
    """The env names of the measured tree's shipped *-fast.toml configs."""
    try:
        import peregrine.train
    except ImportError:
        return []
    directory = Path(peregrine.train.__file__).parent / "configs"
    return sorted(path.name[:-len("-fast.toml")] for path in directory.glob("*-fast.toml"))


@pytest.mark.parametrize("env_name", _fast_configs())
def test_ppo_update(benchmark, env_name):
    ppo = pytest.importorskip("peregrine.train.ppo")
    from peregrine.train import load_config
    config = load_config(env_name, config_file="fast",
                         overrides=[("train.total_steps", 10 ** 15), *tiny_trainer_overrides()])
    trainer = ppo.Trainer(config)
    try:
        trainer.update()   # warm-up: lazy initialisation, the first compiled call
        benchmark.group = "ppo_update"
        benchmark.pedantic(trainer.update, rounds=1 if TINY else 3, iterations=1)
        benchmark.extra_info["steps_per_update"] = trainer.batch_size
        benchmark.extra_info["sps"] = trainer.batch_size / seconds(benchmark, "min")
    finally:
        trainer.close()


# ---- cold_start -------------------------------------------------------------------------
def test_cold_start(benchmark, tmp_path):
    """Process start -> the first update's progress line of `peregrine train cartpole`."""
    source = os.path.dirname(os.path.dirname(os.path.abspath(peregrine.__file__)))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [source, os.environ.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1")
    sizes = ["--vec.num_envs", "4", "--train.horizon", "8", "--train.minibatch_size", "32"] \
        if TINY else []
    runs = {"count": 0, "process": None}

    def reap():
        """Untimed: waits for the previous run to exit (it was sent SIGTERM)."""
        process = runs["process"]
        if process is not None:
            process.communicate(timeout=300)
            runs["process"] = None

    def start_to_first_result():
        runs["count"] += 1
        run_dir = Path(tempfile.mkdtemp(prefix=f"run{runs['count']}-", dir=tmp_path))
        process = subprocess.Popen(
            [sys.executable, "-m", "peregrine.cli", "train", "cartpole", "--run-dir", str(run_dir),
             "--train.progress_interval", "1", "--train.checkpoint_interval", "0", *sizes],
            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs["process"] = process
        for line in process.stdout:
            if line.startswith("update "):
                process.terminate()     # SIGTERM: the run ends; only the first result counts
                return
        raise RuntimeError(f"peregrine train printed no progress line: {process.stderr.read()}")

    benchmark.group = "cold_start"
    try:
        benchmark.pedantic(start_to_first_result, setup=reap, rounds=1 if TINY else 3,
                           iterations=1)
    finally:
        process = runs["process"]
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            process.communicate()
