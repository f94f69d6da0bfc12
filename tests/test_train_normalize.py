"""Observation normalisation and reward scaling (train.normalize_obs / normalize_reward)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.normalize import (EPSILON, ObservationNormalizer, RewardScaler,
                                       RunningMeanStd)
from peregrine.train.ppo import Trainer
from test_train_bootstrap import CounterEnv


def test_running_stats_equal_numpy_over_all_batches():
    rng = np.random.default_rng(3)
    stats = RunningMeanStd((3,))
    batches = [rng.normal([5.0, -2.0, 1e3], [0.1, 4.0, 50.0], size=(n, 3)).astype(np.float32)
               for n in (1, 7, 64, 2, 300, 1)]
    for batch in batches:
        stats.update(batch)
    data = np.concatenate(batches).astype(np.float64)
    assert stats.count == len(data)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-10)
    stats.update(np.zeros((0, 3), np.float32))          # an empty batch changes nothing
    assert stats.count == len(data)


def test_masked_updates_equal_numpy_over_the_live_rows_only():
    """Agent masks: a dead row (here holding the largest float32, whose square would
    swamp float64 sums) is left out through weighted sums, the count comes from the
    mask, and a batch with no live row (the first one included) changes nothing. No
    host read: every step runs under NoHostSync."""
    from test_train_device import NoHostSync
    rng = np.random.default_rng(5)
    stats = RunningMeanStd((2,))
    live_rows = []
    for n, p_live in ((6, 0.0), (9, 0.5), (40, 0.7), (5, 0.0), (64, 0.9), (3, 1.0)):
        batch = rng.normal([3.0, -7.0], [2.0, 0.01], size=(n, 2)).astype(np.float32)
        live = rng.random(n) < p_live
        batch[~live] = [np.finfo(np.float32).max, -np.finfo(np.float32).max]
        with NoHostSync():
            stats.update(torch.from_numpy(batch), torch.from_numpy(live))
        live_rows.append(batch[live])
        if not any(len(rows) for rows in live_rows):
            assert stats.count == 0 and torch.equal(stats.var, torch.ones(2, dtype=torch.float64))
    data = np.concatenate(live_rows).astype(np.float64)
    assert isinstance(stats.count, torch.Tensor) and stats.count == len(data)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-10)
    # The same rows given without dead ones (boolean-indexed on the host) agree.
    unmasked = RunningMeanStd((2,))
    for rows in live_rows:
        unmasked.update(rows)
    torch.testing.assert_close(stats.mean, unmasked.mean, rtol=1e-14, atol=0)
    torch.testing.assert_close(stats.var, unmasked.var, rtol=1e-12, atol=0)


def test_ranks_synchronised_hold_the_statistics_of_every_rank_s_samples():
    """Data-parallel ranks (normalize.py, RunningMeanStd.synchronise): three simulated
    ranks update their own statistics from their own batches, some rows dead and one
    rank with nothing new in a round; after each synchronisation every rank holds the
    same bits, NumPy's mean and variance over every live sample any rank has seen, and
    the observation normaliser's shift and scale follow. A rank that loaded a checkpoint
    counts only what it saw after it."""
    rng = np.random.default_rng(11)
    ranks = [ObservationNormalizer(3) for _ in range(3)]
    seen = []

    def gather(_):      # every rank's increment, in rank order (DataParallel.gather_rows)
        return torch.stack([rank.stats._increment() for rank in ranks])
    for round_ in range(3):
        for index, rank in enumerate(ranks):
            if round_ == 1 and index == 2:
                continue                                    # no new samples this round
            for n in (5, 17):
                batch = rng.normal([2.0, -300.0, 0.0], [1.0, 20.0, 1e-3],
                                   size=(n, 3)).astype(np.float32)
                live = rng.random(n) < 0.8
                rank.update(torch.from_numpy(batch), torch.from_numpy(live))
                seen.append(batch[live])
        increments = gather(None)
        for rank in ranks:
            rank.synchronise(lambda _: increments)
        data = np.concatenate(seen).astype(np.float64)
        for rank in ranks:
            assert torch.equal(rank.stats.mean, ranks[0].stats.mean)
            assert torch.equal(rank.stats.var, ranks[0].stats.var)
            assert rank.stats.count == len(data)
            np.testing.assert_allclose(rank.stats.mean, data.mean(0), rtol=1e-12)
            np.testing.assert_allclose(rank.stats.var, data.var(0), rtol=1e-9)
            assert torch.equal(rank.shift, rank.stats.mean.float())
    resumed = ObservationNormalizer(3)
    resumed.load_state_dict(ranks[0].state_dict())
    assert resumed.stats._increment()[0] == 0
    resumed.update(torch.ones(4, 3))
    assert resumed.stats._increment()[0] == 4
    torch.testing.assert_close(resumed.stats._increment()[1:4],
                               torch.ones(3, dtype=torch.float64))


def test_observation_normalizer_formula_clip_and_input_untouched():
    norm = ObservationNormalizer(2, clip=3.0)
    data = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 10.0]], np.float32)
    norm.update(data)
    raw = np.array([[2.0, 10.0], [100.0, 9.0]], np.float32)
    before = raw.copy()
    got = norm.normalize(torch.from_numpy(raw)).numpy()
    np.testing.assert_array_equal(raw, before)            # the env's buffer is only read
    expected = np.clip((raw - data.mean(0)) / np.sqrt(data.var(0) + EPSILON), -3.0, 3.0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert got[1, 0] == 3.0 and got[1, 1] == -3.0         # clipped both ways


@pytest.mark.parametrize("masked", [False, True])
def test_reward_scaler_matches_discounted_return_reference(masked):
    """Every row's discounted return, reset after its episode ends; with agent masks
    only the live rows' returns enter the statistics (every row is still scaled)."""
    rng = np.random.default_rng(4)
    rows, steps, gamma = 3, 40, 0.9
    rewards = rng.normal(2.0, 3.0, size=(steps, rows)).astype(np.float32)
    dones = rng.random((steps, rows)) < 0.1
    live = rng.random((steps, rows)) < (0.6 if masked else 1.1)
    live[0] = True                              # the reference's variance needs a sample
    scaler = RewardScaler(rows, gamma, clip=5.0)
    out = np.zeros(rows, np.float32)
    running, seen = np.zeros(rows), []
    for t in range(steps):
        got = scaler.scale(rewards[t], dones[t], out,
                           torch.from_numpy(live[t]) if masked else None).copy()
        running = gamma * running + rewards[t]
        seen.extend(running[live[t]])
        expected = np.clip(rewards[t] / np.sqrt(np.var(seen) + EPSILON), -5.0, 5.0)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        running[dones[t]] = 0.0
    np.testing.assert_allclose(scaler.stats.var, np.var(seen), rtol=1e-10)


def normalised_trainer(env, **train):
    overrides = [("vec.num_envs", env.num_envs), ("train.horizon", 12),
                 ("train.minibatch_size", 32), ("train.update_epochs", 2),
                 ("train.normalize_obs", True)]
    overrides += [(f"train.{k}", v) for k, v in train.items()]
    return Trainer(load_config("cartpole", overrides=overrides), env=env)


def test_rollout_normalises_into_storage_and_bootstraps_from_normalised_final_obs():
    """The env's observation buffer keeps raw counts; the storage holds them normalised
    with the statistics of every observation seen so far; the truncation bootstrap
    evaluates V on the normalised final observation."""
    env = CounterEnv(num_envs=6, limit=5)
    trainer = normalised_trainer(env)
    seen = [env.observations[:, 0].copy()]
    stored_expected = []
    final_inputs = []
    value = trainer.policy.value

    def recording_value(obs, *args):
        if obs.shape[0] < env.num_envs:       # a bootstrap: only the truncated rows
            final_inputs.append((obs.clone(), trainer.pipeline.obs_norm.shift.clone(),
                                 trainer.pipeline.obs_norm.scale.clone()))
        return value(obs, *args)

    trainer.policy.value = recording_value
    step = env.step

    def recording_step(actions):
        data = np.concatenate(seen)
        stored_expected.append(np.clip((env.observations[:, 0] - data.mean())
                                       / np.sqrt(data.var() + EPSILON), -10, 10))
        result = step(actions)
        seen.append(env.observations[:, 0].copy())
        return result

    env.step = recording_step
    trainer.rollout()
    assert env.observations.max() < env.limit and env.observations.min() >= 0   # raw, untouched
    np.testing.assert_allclose(trainer.storage.obs[:, :, 0].numpy(), np.array(stored_expected),
                               rtol=1e-5, atol=1e-6)
    assert len(final_inputs) == trainer.horizon    # staggered rows: a cut on every step
    for obs, shift, scale in final_inputs:
        expected = ((torch.full_like(obs, float(env.limit)) - shift) * scale).clamp(-10, 10)
        torch.testing.assert_close(obs, expected)
        assert not torch.allclose(obs, torch.full_like(obs, float(env.limit)))
    trainer.close()


def test_checkpoint_round_trip_and_load_actor_applies_the_statistics(tmp_path):
    config = load_config("pendulum", overrides=[
        ("vec.num_envs", 4), ("train.horizon", 16), ("train.minibatch_size", 32),
        ("train.total_steps", 64), ("train.normalize_obs", True), ("train.normalize_reward", True)])
    trainer = Trainer(config)
    trainer.update()
    path = tmp_path / "c.pt"
    checkpoint.save(path, trainer.state_dict())
    payload = checkpoint.load(path)
    restored = ObservationNormalizer(3)
    restored.load_state_dict(payload["obs_normalizer"])
    stats = trainer.pipeline.obs_norm.stats
    assert restored.stats.count == stats.count == 4 + 64
    assert np.array_equal(restored.stats.mean, stats.mean)
    assert np.array_equal(restored.stats.var, stats.var)
    assert payload["reward_scaler"]["count"] == 64

    actor = checkpoint.load_actor(path, trainer.env)
    observations = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32) * 3
    raw = observations.copy()
    with torch.no_grad():
        normalised = trainer.pipeline.obs_norm.normalize(torch.from_numpy(raw))
        params, _, _ = trainer.policy.heads(normalised)
    expected = params.clamp(-2.0, 2.0).numpy()
    np.testing.assert_allclose(actor(observations), expected, rtol=1e-6)
    np.testing.assert_array_equal(observations, raw)
    # Without the statistics the actor would act differently: they matter.
    with torch.no_grad():
        plain, _, _ = trainer.policy.heads(torch.from_numpy(raw))
    assert not np.allclose(plain.clamp(-2.0, 2.0).numpy(), expected)
    # A checkpoint claiming normalisation but lacking its statistics is refused.
    del payload["obs_normalizer"]
    checkpoint.save(tmp_path / "bad.pt", payload)
    with pytest.raises(ValueError, match="normaliser statistics"):
        checkpoint.load_actor(tmp_path / "bad.pt", trainer.env)
    trainer.close()


def test_bad_clip_values_are_refused():
    with pytest.raises(ValueError, match="train.obs_clip must be > 0"):
        load_config("cartpole", overrides=[("train.obs_clip", 0)])
