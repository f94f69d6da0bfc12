"""train.overlap: the actor process collects rollout k+1 while the learner learns on
rollout k. It learns, is deterministic for a seed (its schedule is fixed), resumes
exactly, corrects the lag in the advantages, and fails fast and cleanly."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import pytest
import torch

from peregrine.train import checkpoint
from peregrine.train.advantages import compute_gae
from peregrine.train.config import load_config
from peregrine.train.overlap import ActorDiedError, ActorError, OverlapTrainer
from peregrine.train.resources import child_pids
from peregrine.train.ppo import Trainer
from test_train_checkpoint import parameters, run_updates, train_until_solved
from test_train_checkpoint import small_config as checkpoint_small_config
from polling import poll_until, wait_gone
from test_vector_helpers import pid_alive


def small_config(*extra):
    """The checkpoint tests' small CartPole run, with overlap on."""
    return checkpoint_small_config(("train.overlap", True), *extra)


def test_overlap_learns_cartpole():
    """The shipped CartPole config with overlap on (seed 1 solves at about 50k steps;
    synchronous PPO at about 27k: the lag costs steps on this aggressive config)."""
    trainer = OverlapTrainer(load_config("cartpole", overrides=[
        ("train.overlap", True), ("train.total_steps", 200_000), ("train.seed", 1)]))
    try:
        record = train_until_solved(trainer)
        split = record["time_split"]
        assert set(split) == {"env", "forward", "learn", "wait", "overlap"}
        assert split["env"] > 0 and split["forward"] > 0 and split["learn"] > 0
        assert 0 < record["losses"]["importance_weight"] <= 1
    finally:
        trainer.close()


def test_same_seed_gives_identical_losses_and_the_lag_shows():
    first, second = OverlapTrainer(small_config()), OverlapTrainer(small_config())
    try:
        expected = run_updates(first, 4)
        assert run_updates(second, 4) == expected
        for a, b in zip(parameters(first), parameters(second)):
            assert torch.equal(a, b)
    finally:
        first.close()
        second.close()
    # Rollout 0 is collected with theta_0, which update 0 starts from: no lag, weights 1
    # (up to rounding: the rollout's forward ran row block by row block). Rollout 1 also
    # comes from theta_0 but update 1 starts from theta_1: the lag shows.
    assert expected[0]["importance_weight"] == pytest.approx(1.0, abs=1e-6)
    assert all(x["importance_weight"] < 1.0 - 1e-4 for x in expected[1:])
    sync = Trainer(small_config(("train.overlap", False)))
    try:
        without_weights = [{k: v for k, v in x.items() if k != "importance_weight"}
                           for x in expected]
        assert run_updates(sync, 4)[1:] != without_weights[1:]
    finally:
        sync.close()


def test_resume_continues_exactly(tmp_path):
    """Save after 2 updates (the pending rollout 2 and the actor's state go with it),
    load into a fresh trainer, run 3 more: equal to 5 uninterrupted updates."""
    uninterrupted = OverlapTrainer(small_config())
    try:
        expected = run_updates(uninterrupted, 5)
        final = parameters(uninterrupted)
    finally:
        uninterrupted.close()
    first = OverlapTrainer(small_config())
    try:
        got = run_updates(first, 2)
        path = tmp_path / "ckpt.pt"
        checkpoint.save(path, first.state_dict())
        got.append(first.update()["losses"])     # saving does not disturb the run
        assert got == expected[:3]
    finally:
        first.close()
    resumed = OverlapTrainer(small_config())
    try:
        resumed.load_state_dict(checkpoint.load(path))
        assert resumed.updates == 2
        got = got[:2] + run_updates(resumed, 3)
        assert got == expected
        for a, b in zip(parameters(resumed), final):
            assert torch.equal(a, b)
    finally:
        resumed.close()


def test_dead_actor_is_an_error_within_seconds():
    trainer = OverlapTrainer(small_config(("train.total_steps", 10**9)))
    try:
        trainer.update()
        os.kill(trainer.actor.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(ActorDiedError, match="exit code -9"):
            for _ in range(3):
                trainer.update()
        assert time.monotonic() - start < 10
    finally:
        trainer.close()
    assert not multiprocessing.active_children()


def test_error_in_the_actor_comes_back_with_its_traceback():
    trainer = OverlapTrainer(small_config())
    try:
        trainer._send("no such command")
        with pytest.raises(ActorError, match="unknown overlap actor command"):
            trainer.update()
    finally:
        trainer.close()
    assert not multiprocessing.active_children()


def test_ctrl_c_on_the_cli_saves_and_leaves_no_process(tmp_path):
    """A real SIGINT reaches the learner and the actor (one process group): the actor
    ignores it, the learner finishes its update, saves with the actor's state, stops it."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "peregrine.cli", "train", "cartpole", "--detach", "--run-dir",
         str(run_dir), "--train.total-steps", "1e9", "--vec.num-envs", "8",
         "--train.overlap", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    poll_until(lambda: metrics.exists() and metrics.stat().st_size > 0, 60, 0.1)
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                              text=True).stdout.split()
    assert children, "no actor process was started"
    os.killpg(process.pid, signal.SIGINT)     # as a terminal's Ctrl-C: the whole group
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    records = [json.loads(line) for line in metrics.open()]
    assert records[-1] == {"status": "interrupted"}
    state = checkpoint.load(run_dir / "checkpoints" / "latest.pt")
    assert state["updates"] == records[-2]["updates"]
    assert state["overlap"]["pending"] is not None
    # The actor, and multiprocessing's resource tracker, which exits once its parent has.
    assert wait_gone([int(pid) for pid in children], 10) == []


@pytest.mark.parametrize("extra, named", [
    (("policy.lstm", True), "policy.lstm"),
    (("train.normalize_obs", True), "train.normalize_obs"),
    (("train.teacher", "cartpole_balance"), "train.teacher"),
])
def test_unsupported_combinations_are_refused_by_name(extra, named):
    with pytest.raises(ValueError, match=named):
        small_config(extra)


def test_an_emulated_env_steps_in_the_actor_or_in_its_own_workers():
    """An emulated env's "auto" backend is serial under overlap (the actor steps it);
    "multiprocessing" gives the actor worker processes of its own, which leave with it,
    and the same seed trains to the same losses either way."""
    overrides = [("train.overlap", True), ("vec.num_envs", 4), ("train.horizon", 32),
                 ("train.minibatch_size", 64), ("train.total_steps", 256)]
    config = load_config("gym:CartPole-v1", overrides=overrides)
    assert config.vec.backend == "serial"
    assert load_config("gym:CartPole-v1").vec.backend == "multiprocessing"
    with pytest.raises(ValueError, match="an env callable without an import path"):
        load_config(lambda: gym.make("CartPole-v1"), overrides=[("train.overlap", True)])
    losses = {}
    for backend, num_workers in (("serial", 1), ("multiprocessing", 2)):
        trainer = OverlapTrainer(load_config("gym:CartPole-v1", overrides=[
            *overrides, ("vec.backend", backend), ("vec.num_workers", num_workers)]))
        try:
            losses[backend] = run_updates(trainer, 2)
            workers = [child for child in child_pids(trainer.actor.pid)    # spawned, not
                       if "spawn_main" in _command_line(child)]        # the shm tracker
            assert len(workers) == (num_workers if backend == "multiprocessing" else 0)
        finally:
            trainer.close()
        assert not any(pid_alive(pid) for pid in workers)
    assert losses["multiprocessing"] == losses["serial"]


def _command_line(pid) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().decode(errors="replace")
    except FileNotFoundError:           # gone meanwhile
        return ""


def test_importance_weighted_gae():
    """Weights of 1 give plain GAE; otherwise each TD error and trace is weighted:
    A_t = w_t * delta_t + gamma * lam * w_t * (1 - done_t) * A_{t+1}."""
    generator = torch.Generator().manual_seed(0)
    T, rows, gamma, lam = 5, 3, 0.9, 0.8
    rewards, values = torch.randn(T, rows, generator=generator), torch.randn(T, rows,
                                                                             generator=generator)
    dones = torch.rand(T, rows, generator=generator) < 0.3
    last = torch.randn(rows, generator=generator)
    weights = torch.rand(T, rows, generator=generator)
    plain = compute_gae(rewards, values, dones, last, gamma, lam)
    assert torch.equal(compute_gae(rewards, values, dones, last, gamma, lam,
                                   importance=torch.ones(T, rows)), plain)
    expected = torch.zeros(T, rows)
    following = torch.zeros(rows)
    for t in reversed(range(T)):
        next_value = last if t == T - 1 else values[t + 1]
        not_done = 1.0 - dones[t].float()
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        following = weights[t] * delta + gamma * lam * weights[t] * not_done * following
        expected[t] = following
    got = compute_gae(rewards, values, dones, last, gamma, lam, importance=weights)
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, plain)
