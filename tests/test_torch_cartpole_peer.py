"""benchmarks/torch_cartpole.py: the batched-PyTorch CartPole peer of the GPU comparison.

It must be CartPole-v1 as Peregrine's CartPole is (else the speed ratio compares
different work), plug into the Trainer through its adapter, learn there, and its
command line must run in seconds on the CPU (the GPU acceptance's dry run calls it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import peregrine
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch_cartpole  # noqa: E402
from torch_cartpole import TorchCartPole, TrainerEnv  # noqa: E402

STEPS = 300
INSTANCES = 64


def test_torch_cartpole_matches_peregrines_step_for_step():
    """From Peregrine's state before every step (resynchronised each step, so float
    rounding cannot accumulate), the same actions give the same next state (the
    final observation for rows that ended), the same terminal and truncation flags
    and reward 1; ended rows restart from a fresh state in [-0.05, 0.05]. Step
    counters are pushed to 499 now and then so that truncation happens, and one row
    falls on its 500th step (terminal only, as in Peregrine)."""
    peregrine_env = peregrine.make("cartpole", num_envs=INSTANCES, seed=0, device="cpu")
    torch_env = TorchCartPole(INSTANCES, "cpu", seed=1)
    rng = np.random.default_rng(0)
    states = peregrine_env.get_states()
    states[0] = [2.39, 1.0, 0.0, 0.0, 499]        # leaves the track on step 500
    peregrine_env.set_states(states)
    counts = {"terminal": 0, "truncated": 0, "terminal_on_500th": 0}
    for step in range(STEPS):
        states = peregrine_env.get_states()
        if step and step % 10 == 0:                 # a few rows reach the time limit next
            rows = rng.choice(INSTANCES, 4, replace=False)
            states[rows, 4] = 499
            peregrine_env.set_states(states)
        torch_env.state = torch.tensor(states[:, :4], dtype=torch.float32)
        torch_env.steps = torch.tensor(states[:, 4], dtype=torch.int32)
        actions = rng.integers(0, 2, INSTANCES)
        observations, rewards, terminated, truncated, final = torch_env.step(
            torch.from_numpy(actions))
        peregrine_env.step(torch.from_numpy(actions.astype(np.int32)))

        assert torch.equal(terminated, peregrine_env.terminals), step
        assert torch.equal(truncated, peregrine_env.truncations), step
        assert torch.equal(rewards, torch.ones(INSTANCES))
        done = terminated | truncated
        expected = torch.where(done.unsqueeze(1), peregrine_env.final_observations,
                               peregrine_env.observations)
        torch.testing.assert_close(final, expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(observations[~done], final[~done])
        assert (observations[done].abs() <= 0.05).all()
        assert (torch_env.steps[done] == 0).all()
        assert torch.equal(torch_env.steps[~done],
                           torch.tensor(states[:, 4] + 1, dtype=torch.int32)[~done])
        counts["terminal"] += int(terminated.sum())
        counts["truncated"] += int(truncated.sum())
        counts["terminal_on_500th"] += int((terminated & (torch.from_numpy(states[:, 4]) == 499)
                                            ).sum())
    peregrine_env.close()
    assert counts["terminal"] > 100 and counts["truncated"] > 20, counts
    assert counts["terminal_on_500th"] >= 1, counts


def test_resets_are_uniform_and_seeded():
    env = TorchCartPole(4096, "cpu", seed=3)
    first = env.state.clone()
    assert first.min() >= -0.05 and first.max() < 0.05
    assert abs(float(first.mean())) < 0.005 and float(first.std()) > 0.025   # U(-.05, .05)
    assert torch.equal(TorchCartPole(4096, "cpu", seed=3).state, first)
    assert not torch.equal(env.reset(seed=4), first)
    assert torch.equal(env.reset(seed=3), first)
    assert int(env.steps.abs().sum()) == 0


def test_adapter_keeps_its_buffers_and_counts_episodes():
    """The trainer holds views of the buffers, so step writes into the same tensors;
    the episode statistics are those of the episodes that ended (for CartPole, return
    = length), then cleared."""
    env = TrainerEnv(32, "cpu", seed=0)
    observations, _ = env.reset(seed=5)
    buffers = [env.observations, env.rewards, env.terminals, env.truncations]
    lengths = np.zeros(32)
    ended = []
    for _ in range(200):
        output = env.step(torch.ones(32, dtype=torch.int64))   # always right: falls fast
        assert all(a is b for a, b in zip(output[:4], buffers))
        lengths += 1
        done = (env.terminals | env.truncations).numpy()
        ended += list(lengths[done])
        lengths[done] = 0
    assert observations is env.observations
    stats = env.episode_stats()
    assert stats.count == len(ended) > 32
    assert stats.mean["episode_length"] == pytest.approx(np.mean(ended))
    assert stats.mean["episode_return"] == pytest.approx(np.mean(ended))
    assert stats.std["episode_length"] == pytest.approx(np.std(ended))
    assert env.episode_stats().count == 0


def test_adapter_learns_in_peregrines_trainer():
    """CartPole's shipped config on the device loop (CPU), the torch env passed in:
    the mean return rises well above a random policy's (~20) within 24 updates."""
    config = load_config("cartpole", overrides=[
        ("vec.backend", "device"), ("train.device", "cpu"), ("train.checkpoint_interval", 0),
        ("train.stop_return", 0.0)])
    env = TrainerEnv(config.vec.num_envs, "cpu", config.train.seed)
    trainer = Trainer(config, env=env)
    try:
        returns = [trainer.update()["episode_return"] for _ in range(24)]
    finally:
        trainer.close()
    assert returns[0] < 40
    assert trainer.recent_return() > 2 * returns[0] and trainer.recent_return() > 60, returns


def test_command_line_rows(tmp_path):
    """The CPU dry run: both modes, both implementations, rows as documented."""
    out = tmp_path / "rows.json"
    threads = torch.get_num_threads()
    try:
        assert torch_cartpole.main(["--device", "cpu", "--sizes", "8", "--seconds", "0.05",
                                    "--mode", "both", "--set", "train.minibatch_size=64",
                                    "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)      # main() runs the CPU rows on one thread
    rows = json.loads(out.read_text())
    assert [(row["mode"], row["impl"]) for row in rows] == [
        ("env", "torch"), ("env", "peregrine"), ("train", "torch"), ("train", "peregrine")]
    for row in rows:
        assert row["instances"] == 8 and row["sps"] > 0
    assert rows[2]["overrides"] == [["train.minibatch_size", "64"]]
