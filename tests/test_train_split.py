"""vec.split = 2: the batch as two halves stepped alternately, each half's env step
(a native block on a worker thread, or a group of worker processes) beside the
other half's forward (train/collect.py). It
learns, is deterministic for a seed, resumes exactly, keeps LSTM state, action masks
and truncation bootstraps per half, really overlaps, and refuses what it cannot do."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from peregrine.train import checkpoint, collect
from peregrine.train.config import load_config
from peregrine.train.environment import ActionBuffer, make_env, split_blocks
from peregrine.train.ppo import Trainer
from test_train_checkpoint import SMALL, parameters, run_updates, train_until_solved

CASES = {   # name -> (env, overrides beside SMALL: 8 instances, 16 steps per update)
    "mlp": ("cartpole", []),
    "lstm": ("cartpole", [("policy.lstm", True), ("policy.bptt_horizon", 8)]),
    "drone_swarm": ("drone_swarm", []),     # 8 agent rows per instance, Box actions
    "prospector": ("prospector", []),       # Discrete actions masked from the observation
    # The halves as two groups of worker processes, with the normalisers (shared
    # statistics, per-row reward returns) on.
    "processes": ("cartpole", [("vec.backend", "multiprocessing"), ("vec.num_workers", 2),
                               ("train.normalize_obs", True),
                               ("train.normalize_reward", True)]),
}


def split_config(case="mlp", *extra):
    """A small vec.split = 2 run whose episodes are truncated every 10 steps (so
    bootstraps and resets happen inside each rollout, in both halves)."""
    env, overrides = CASES[case]
    return load_config(env, overrides=SMALL + [("vec.split", 2), ("env.max_steps", 10)]
                       + overrides + list(extra))


def test_split_learns_cartpole():
    """The shipped CartPole config with vec.split = 2 (seed 1 solves at about 33k
    steps, split = 1 at about 27k)."""
    trainer = Trainer(load_config("cartpole", overrides=[
        ("vec.split", 2), ("train.total_steps", 200_000), ("train.seed", 1)]))
    try:
        assert isinstance(trainer.collector, collect.SplitCollector)
        record = train_until_solved(trainer)
        split = record["time_split"]
        assert set(split) == {"env", "forward", "env_hidden", "learn"}
        assert split["forward"] > 0 and split["learn"] > 0
        assert split["env"] >= 0 and split["env_hidden"] >= 0
    finally:
        trainer.close()


@pytest.mark.parametrize("case", list(CASES))
def test_same_seed_gives_identical_runs(case):
    first, second = Trainer(split_config(case)), Trainer(split_config(case))
    try:
        expected = run_updates(first, 3)
        assert run_updates(second, 3) == expected
        for a, b in zip(parameters(first), parameters(second)):
            assert torch.equal(a, b)
        assert torch.equal(first.storage.obs, second.storage.obs)
        # Episodes ended inside the rollout, so bootstraps and resets ran per half.
        assert first.storage.dones.any()
    finally:
        first.close()
        second.close()
    other = Trainer(split_config(case, ("train.seed", 2)))
    try:
        assert run_updates(other, 1) != expected[:1]
    finally:
        other.close()


@pytest.mark.parametrize("case", ["mlp", "drone_swarm"])
def test_episode_statistics_cover_both_halves(case):
    """The update's episode count is every episode that ended in either half's rows
    (a DroneSwarm episode ends on all 8 drone rows of its instance at once)."""
    trainer = Trainer(split_config(case))
    try:
        rows_per_episode = trainer.rows // trainer.env.num_envs
        for _ in range(2):
            record = trainer.update()
            ended = int(trainer.storage.dones.sum()) // rows_per_episode
            assert ended > 0 and record["episodes_this_update"] == ended
            halves = trainer.collector.halves
            assert all(trainer.storage.dones[:, half.begin:half.end].any() for half in halves)
    finally:
        trainer.close()


def test_halves_run_their_own_streams():
    """Block b is seeded as vector.Serial seeds its block b (seed + b*phi): the halves'
    instances do not repeat each other's episodes, and the batch is that backend's."""
    config = split_config()
    env = make_env(config)
    serial = make_env(load_config("cartpole", overrides=SMALL + [
        ("vec.backend", "serial"), ("vec.num_workers", 2)]))
    try:
        first, second = split_blocks(env)
        assert first.num_envs == second.num_envs == 4
        assert not np.array_equal(first.observations, second.observations)
        assert np.array_equal(env.observations, serial.observations)
        actions = np.zeros(8, np.int32)
        for _ in range(5):
            env.step(actions)
            serial.step(actions)
        assert np.array_equal(env.observations, serial.observations)
    finally:
        env.close()
        serial.close()


@pytest.mark.parametrize("case", ["mlp", "lstm", "processes"])
def test_resume_continues_exactly(tmp_path, case):
    """Stop after 2 updates, save, load into a fresh trainer, run 3 more: equal to an
    uninterrupted 5-update run (both halves' instance states and streams, the LSTM
    state of every row, the sampling generator)."""
    uninterrupted = Trainer(split_config(case))
    first = Trainer(split_config(case))
    try:
        expected = run_updates(uninterrupted, 5)
        assert first.exact_resume
        got = run_updates(first, 2)
        checkpoint.save(tmp_path / "c.pt", first.state_dict())
    finally:
        first.close()
    resumed = Trainer(split_config(case))
    try:
        resumed.load_state_dict(checkpoint.load(tmp_path / "c.pt"))
        got += run_updates(resumed, 3)
        assert got == expected
        for a, b in zip(parameters(resumed), parameters(uninterrupted)):
            assert torch.equal(a, b)
    finally:
        resumed.close()
        uninterrupted.close()


@pytest.mark.parametrize("case", ["mlp", "lstm", "prospector"])
def test_staged_rows_give_the_same_run(case):
    """The CUDA path's staging (env outputs copied into separate host arrays that the
    pipelines read, unpinned here) changes nothing: same losses and weights."""
    direct, staged = Trainer(split_config(case)), Trainer(split_config(case))
    try:
        staged.collector.close()
        staged.collector = collect.SplitCollector(staged.env, staged.device, staged.config.train,
                                                  staged.policy.obs_dim,
                                                  staged.pipeline.mask_slice, staged=True)
        staged.pipeline = staged.collector.pipeline
        assert all(isinstance(half.rows, collect.PinnedRows) for half in staged.collector.halves)
        assert run_updates(staged, 3) == run_updates(direct, 3)
        for a, b in zip(parameters(staged), parameters(direct)):
            assert torch.equal(a, b)
    finally:
        direct.close()
        staged.close()


@pytest.mark.parametrize("case", ["mlp", "drone_swarm", "prospector"])
def test_each_half_writes_its_own_rows(case):
    """What each half's env returned lands in that half's storage rows: the next
    step's observations (and valid-action mask), the episode ends, and the rewards,
    with gamma * V(final observation) added on the rows cut by truncation alone."""
    trainer = Trainer(split_config(case))
    outputs = {0: [], 1: []}
    for index, half in enumerate(trainer.collector.halves):
        step = half.env.step

        def recording_step(actions, step=step, index=index):
            result = step(actions)
            env = trainer.collector.halves[index].env
            outputs[index].append({name: getattr(env, name).copy() for name in (
                "observations", "final_observations", "rewards", "terminals", "truncations")})
            return result
        half.env.step = recording_step
    try:
        trainer.collect()
        storage, gamma = trainer.storage, trainer.config.train.gamma
        truncated_rows = 0
        for index, half in enumerate(trainer.collector.halves):
            rows = slice(half.begin, half.end)
            assert len(outputs[index]) == trainer.horizon
            for step, out in enumerate(outputs[index]):
                if step + 1 < trainer.horizon:
                    observations = torch.from_numpy(out["observations"])
                    assert torch.equal(storage.obs[step + 1, rows], observations)
                    if storage.action_mask is not None:
                        valid = observations[:, trainer.pipeline.mask_slice] > 0.5
                        assert torch.equal(storage.action_mask[step + 1, rows], valid)
                assert torch.equal(storage.dones[step, rows],
                                   torch.from_numpy(out["terminals"] | out["truncations"]))
                cut = torch.from_numpy(out["truncations"] & ~out["terminals"])
                with torch.no_grad():
                    final_values = trainer.policy.value(torch.from_numpy(
                        out["final_observations"]))
                expected = torch.from_numpy(out["rewards"]) + gamma * final_values * cut
                assert torch.allclose(storage.rewards[step, rows], expected, atol=1e-6)
                truncated_rows += int(cut.sum())
        assert truncated_rows > 0
    finally:
        trainer.close()


def test_lstm_state_is_carried_per_row():
    """After a rollout the trainer's LSTM state is every row's, halves in row order:
    the value of the current observations from it equals the last-value the split
    collector's pipeline gives for each half's rows alone."""
    trainer = Trainer(split_config("lstm"))
    try:
        trainer.update()
        h, c = trainer.rollout_state.lstm
        assert h.shape == (8, trainer.policy.lstm_size)
        inputs = trainer.pipeline.current()
        with torch.no_grad():
            whole = trainer.policy.value(inputs, (h, c), trainer.rollout_state.starts)
            for half in trainer.collector.halves:
                rows = slice(half.begin, half.end)
                part = trainer.policy.value(inputs[rows], (h[rows], c[rows]),
                                            trainer.rollout_state.starts[rows])
                assert torch.allclose(whole[rows], part, atol=1e-6)
        # The state is not the zero state: it was carried through the rollout.
        assert h.abs().sum() > 0
    finally:
        trainer.close()


def test_lstm_segments_replay_what_each_half_sampled():
    """Training replays every row's segments from the states the split rollout stored
    (per half, zeroed at episode starts): before any update the replay gives back
    the stored log-probs and values, so each half's state was carried and stored
    in its own rows."""
    trainer = Trainer(split_config("lstm"))
    try:
        trainer.collect()
        assert trainer.storage.starts[1:].any()      # episodes restarted mid-rollout
        checked = 0
        with torch.no_grad():
            for batch, _ in next(iter(trainer.minibatches())):
                evaluation = trainer.evaluate(batch, entropy=False)
                assert torch.allclose(evaluation.logprobs, batch["logprobs"], atol=1e-5)
                assert torch.allclose(evaluation.values, batch["values"], atol=1e-5)
                checked += batch["logprobs"].numel()
        assert checked == trainer.storage.size
    finally:
        trainer.close()


def test_env_steps_run_beside_the_forward():
    """Each half's env step runs on the worker thread, and the other half's forward
    runs while it is in flight (the step is slowed down so that this shows on any
    machine; nothing here is timed)."""
    trainer = Trainer(split_config())
    main = threading.get_ident()
    in_flight, seen = [0], {"threads": set(), "forward_beside_step": 0}
    for half in trainer.collector.halves:
        step = half.env.step

        def slow_step(actions, step=step):
            seen["threads"].add(threading.get_ident())
            in_flight[0] += 1
            time.sleep(0.002)
            try:
                return step(actions)
            finally:
                in_flight[0] -= 1
        half.env.step = slow_step
    heads = trainer.policy.heads

    def watched_heads(*args):
        if in_flight[0]:
            seen["forward_beside_step"] += 1
        return heads(*args)
    trainer.policy.heads = watched_heads
    try:
        trainer.collect()
        assert main not in seen["threads"] and len(seen["threads"]) == 1
        assert seen["forward_beside_step"] > trainer.horizon // 2
    finally:
        trainer.close()


def test_worker_groups_step_beside_the_other_halfs_forward():
    """With worker groups, every forward after the first step runs while the other
    half's worker is stepping (started, not yet waited for)."""
    trainer = Trainer(split_config("processes"))
    halves, env = trainer.collector.halves, trainer.env
    heads, calls = trainer.policy.heads, []

    def watched_heads(observations, *args):
        calls.append((observations.shape[0], sorted(env._inflight)))
        return heads(observations, *args)
    trainer.policy.heads = watched_heads
    try:
        trainer.collect()
        rollout = calls[:2 * trainer.horizon]       # then the last value's forward
        assert len(rollout) == 2 * trainer.horizon
        for index, (rows, in_flight) in enumerate(rollout[1:], start=1):
            other = halves[(index + 1) % 2].stepper.group.workers
            assert rows == halves[index % 2].end - halves[index % 2].begin
            assert in_flight == list(other)
    finally:
        trainer.close()


def test_worker_groups_reproduce_the_unsplit_run():
    """On the multiprocessing backend the halves are the same envs the unsplit batch
    steps, and the sampling draws of half 0 then half 1 are the batch's draws in row
    order: vec.split 2 takes the vec.split 1 run's actions exactly (LSTM policy,
    episodes truncated inside the rollout). Its values agree to float rounding: a
    forward over half the rows may round differently in the last bit (bit for bit on
    one CPU; on an AMD EPYC without AVX-512 a policy loss 3e-8 apart, and the stored
    rewards, which carry the truncated rows' bootstrapped values, too), so those are
    compared with a tolerance far below any real difference."""
    runs = []
    for split in (1, 2):
        trainer = Trainer(split_config("lstm", ("vec.backend", "multiprocessing"),
                                       ("vec.num_workers", 2), ("vec.split", split)))
        try:
            assert isinstance(trainer.collector, collect.SplitCollector) == (split == 2)
            runs.append((run_updates(trainer, 3), parameters(trainer),
                         trainer.storage.rewards.clone(), trainer.storage.actions.clone()))
        finally:
            trainer.close()
    (losses, weights, rewards, actions), (split_losses, split_weights, split_rewards,
                                          split_actions) = runs
    assert torch.equal(actions, split_actions)
    assert torch.allclose(rewards, split_rewards, rtol=1e-5, atol=1e-6)
    assert split_losses == [pytest.approx(update, rel=1e-3, abs=1e-6) for update in losses]
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6)
               for a, b in zip(weights, split_weights))


def test_an_emulated_env_splits_into_worker_groups_with_shared_normalisers():
    """A Gymnasium env (Multiprocessing, two workers) split in two groups of workers:
    each half steps its own worker, the halves share one observation normaliser and
    one set of reward statistics (after a rollout: every row's observations of every
    step counted once), the checkpoint holds every row's discounted return, and a
    seed gives the same run twice."""
    overrides = [("vec.num_envs", 8), ("vec.split", 2), ("train.horizon", 16),
                 ("train.minibatch_size", 64), ("train.normalize_obs", True),
                 ("train.normalize_reward", True), ("train.tensorboard", False)]
    runs = []
    for _ in range(2):
        trainer = Trainer(load_config("gym:CartPole-v1", overrides=overrides))
        try:
            assert trainer.config.vec.backend == "multiprocessing"
            assert trainer.config.vec.num_workers == 2      # "auto": whole groups
            halves = trainer.collector.halves
            assert all(isinstance(h.stepper, collect.GroupStepper) for h in halves)
            assert [h.stepper.group.workers for h in halves] == [range(0, 1), range(1, 2)]
            pipeline = trainer.pipeline
            assert all(h.pipeline.obs_norm is pipeline.obs_norm for h in halves)
            assert all(h.pipeline.reward_scaler.stats is pipeline.reward_scaler.stats
                       for h in halves)
            runs.append(run_updates(trainer, 2))
            counted = trainer.rows * (1 + 2 * trainer.horizon)   # + the first observations
            assert int(pipeline.obs_norm.stats.count) == counted
            state = pipeline.state_dict()
            assert state["reward_scaler"]["returns"].shape == (trainer.rows,)
        finally:
            trainer.close()
    assert runs[0] == runs[1]


def test_an_env_error_in_the_worker_reaches_the_trainer():
    trainer = Trainer(split_config())
    calls = [0]
    half = trainer.collector.halves[1]
    step = half.env.step

    def failing_step(actions):
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("the env broke")
        return step(actions)
    half.env.step = failing_step
    try:
        with pytest.raises(RuntimeError, match="the env broke"):
            trainer.collect()
        assert trainer.collector.pending == [False, False]   # nothing left stepping
    finally:
        trainer.close()


@pytest.mark.parametrize("extra, message", [
    ([("vec.split", 3)], "vec.split must be 1 or 2, got 3"),
    ([("vec.backend", "serial")], "vec.split = 2 does not support vec.backend = 'serial'"),
    ([("vec.backend", "device")], "vec.split = 2 does not support vec.backend = 'device'"),
    ([("vec.num_envs", 7)], r"vec.num_envs \(7\) must be divisible by vec.split \(2\)"),
    ([("train.overlap", True)], "vec.split = 2 does not support train.overlap"),
    ([("vec.backend", "multiprocessing"), ("vec.num_workers", 3), ("vec.num_envs", 6)],
     r"steps 2 groups of worker processes: vec.num_workers \(3\) must be a multiple of 2"),
    ([("train.teacher", "random")], "does not support train.teacher"),
])
def test_unsupported_settings_are_refused_by_name(extra, message):
    with pytest.raises(ValueError, match=message):
        load_config("cartpole", overrides=[("vec.split", 2), *extra])


def test_an_env_object_cannot_be_split():
    from peregrine import make
    env = make("cartpole", num_envs=8, seed=1)
    try:
        with pytest.raises(ValueError, match="vec.split = 2 does not support an env object"):
            Trainer(split_config(), env=env)
    finally:
        env.close()


def test_a_teacher_object_is_refused():
    with pytest.raises(ValueError, match="vec.split = 2 does not support train.teacher"):
        Trainer(split_config(), teacher=lambda observations: np.zeros(len(observations)))


def test_pinned_action_buffers_are_for_cuda_only():
    from gymnasium import spaces
    with pytest.raises(ValueError, match="pinned ActionBuffer is for a host batch fed from "
                                         "a CUDA learner"):
        ActionBuffer(spaces.Discrete(2), 4, "cpu", pinned=True)
