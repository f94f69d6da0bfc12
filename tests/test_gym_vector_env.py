"""A Gymnasium VectorEnv as the env: `gym-vec:ID` (gymnasium.make_vec) and any VectorEnv
a callable returns, stepped as one unit of n rows, bit for bit what the vector env gives."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import peregrine.vector as pv
from peregrine.evaluate import evaluate
from peregrine.train.config import load_config
from peregrine.train.run import train
from peregrine.vector.common import unit_seed
from peregrine.vector.emulation import GymnasiumVectorEmulation
from peregrine.vector.sources import EnvFactory, EnvSourceError, kind_of

SYNC = {"vectorization_mode": "sync"}


def reference(count, **kwargs):
    return gym.make_vec("CartPole-v1", num_envs=count, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kwargs)


def test_the_rows_are_the_vector_envs_own_values_bit_for_bit():
    """Observations, rewards, flags (terminal wins over a truncation of the same step),
    final observations of the rows that ended, and each episode's return and length:
    as the same SameStep vector env, reset with the unit's seed, gives them."""
    count, seed, steps = 4, 7, 400
    ours = pv.make(EnvFactory("gym-vec:CartPole-v1", {**SYNC, "num_envs": count,
                                                      "max_episode_steps": 30}),
                   backend="serial", num_envs=count, seed=seed)
    theirs = reference(count, max_episode_steps=30)
    observations, _ = theirs.reset(seed=unit_seed(seed, 0))
    np.testing.assert_array_equal(ours.observations, observations)
    generator = np.random.default_rng(0)
    returns, lengths, episodes = np.zeros(count), np.zeros(count), []
    ended_by = {"terminal": 0, "truncation": 0}
    for _ in range(steps):
        actions = generator.integers(0, 2, count)
        ours.step(actions.astype(ours.actions.dtype))
        observations, rewards, terminated, truncated, info = theirs.step(actions)
        np.testing.assert_array_equal(ours.observations, observations)
        np.testing.assert_array_equal(ours.rewards, rewards.astype(np.float32))
        np.testing.assert_array_equal(ours.terminals, terminated)
        np.testing.assert_array_equal(ours.truncations, truncated & ~terminated)
        returns += rewards
        lengths += 1
        for row in np.flatnonzero(terminated | truncated):
            np.testing.assert_array_equal(ours.final_observations[row], info["final_obs"][row])
            episodes.append((returns[row], lengths[row]))
            returns[row] = lengths[row] = 0
            ended_by["terminal" if terminated[row] else "truncation"] += 1
    assert ended_by["terminal"] > 0 and ended_by["truncation"] > 0, ended_by
    stats = ours.episode_stats()
    assert stats.count == len(episodes)
    assert stats.mean["episode_return"] == pytest.approx(np.mean([r for r, _ in episodes]))
    assert stats.mean["episode_length"] == pytest.approx(np.mean([n for _, n in episodes]))
    ours.close()
    theirs.close()


def test_a_callable_returning_a_vector_env_is_one_unit_of_its_envs():
    """Any VectorEnv a callable returns is a unit of num_envs rows: two calls fill eight
    rows, each block seeded apart."""
    with pv.make(lambda: reference(4), backend="serial", num_envs=8, seed=3) as env:
        units = [unit for block in env.blocks for unit in block.units]
        assert [type(unit) for unit in units] == [GymnasiumVectorEmulation] * 2
        assert env.observations.shape == (8, 4)
        assert not np.array_equal(env.observations[:4], env.observations[4:])


def test_gym_vec_is_a_kind_of_name_with_one_vector_env_per_worker_by_default():
    assert kind_of("gym-vec:CartPole-v1") == "gymnasium_vector"
    with pytest.raises(EnvSourceError, match="gym-vec: needs an id"):
        kind_of("gym-vec:")
    with pv.make("gym-vec:CartPole-v1", backend="serial", num_envs=6, num_workers=2, seed=0,
                 **SYNC) as env:
        units = [unit for block in env.blocks for unit in block.units]
        assert [unit.num_envs for unit in units] == [3, 3]


def test_a_next_step_vector_env_is_refused_naming_the_fix():
    """CartPole's own vector env resets in the next step and cannot do otherwise: the
    message says how to get a SameStep one."""
    with pytest.raises(ValueError, match='SameStep.*vectorization_mode = "sync"'):
        pv.make("gym-vec:CartPole-v1", backend="serial", num_envs=2, seed=0)
    with pytest.raises(ValueError, match="NextStep"):
        pv.make(lambda: gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"),
                backend="serial", num_envs=2, seed=0)


def test_wrappers_wrap_each_env_of_a_sync_vector_env_and_are_refused_otherwise():
    factory = EnvFactory("gym-vec:CartPole-v1", {**SYNC, "num_envs": 2},
                         [{"name": "TimeLimit", "max_episode_steps": 5}])
    with pv.make(factory, backend="serial", num_envs=2, seed=0) as env:
        for _ in range(5):
            env.step(np.zeros(2, env.actions.dtype))
        assert env.truncations.all() or env.terminals.any()
    with pytest.raises(EnvSourceError, match="own vector env takes none"):
        EnvFactory("gym-vec:CartPole-v1", {}, ["NormalizeObservation"])()


def test_bad_values_from_a_vector_env_name_its_row():
    class Broken(gym.vector.VectorEnv):
        metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

        def __init__(self):
            self.num_envs = 3
            self.single_observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
            self.single_action_space = gym.spaces.Discrete(2)
            self.observation_space = gym.vector.utils.batch_space(
                self.single_observation_space, 3)
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, 3)

        def reset(self, seed=None, options=None):
            return np.zeros((3, 2), np.float32), {}

        def step(self, actions):
            observations = np.zeros((3, 2), np.float32)
            observations[2, 1] = np.nan
            return observations, np.zeros(3), np.zeros(3, bool), np.zeros(3, bool), {}

    with pv.make(Broken, backend="serial", num_envs=3, seed=0) as env:
        with pytest.raises(ValueError, match=r"\(row 2\).*not finite"):
            env.step(np.zeros(3, env.actions.dtype))


def test_a_gym_vec_run_trains_evaluates_and_resumes_by_its_checkpoint(tmp_path):
    config = load_config("gym-vec:CartPole-v1", overrides=[
        ("env.vectorization_mode", "sync"), ("vec.backend", "serial"), ("vec.num_envs", 8),
        ("train.total_steps", 8192), ("train.horizon", 256), ("train.minibatch_size", 512),
        ("train.tensorboard", False), ("train.progress_interval", 1000)])
    summary = train(config, tmp_path / "run", overwrite=True)
    assert summary["status"] == "finished" and summary["episodes"] > 0
    checkpoint = tmp_path / "run" / "checkpoints" / "latest.pt"
    found = evaluate(None, str(checkpoint), episodes=4, seed=0)
    assert found["env"] == "gym-vec:CartPole-v1" and found["episodes"] == 4
    assert found["mean"]["episode_length"] >= 8


def test_ale_vector_env_rows_are_its_stacked_frames():
    """ALE's own vector env (C++ threads, grayscale 84x84, four stacked frames): the rows
    are its uint8 frames as it returns them. (ale-py is in the test extra.)"""
    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)
    with pv.make("gym-vec:ALE/Pong-v5", backend="serial", num_envs=2, seed=5,
                 num_threads=1) as env:
        assert env.observations.dtype == np.uint8 and env.observations.shape == (2, 4 * 84 * 84)
        assert env.single_action_space == gym.spaces.Discrete(6)
        theirs = gym.make_vec("ALE/Pong-v5", num_envs=2, num_threads=1,
                              autoreset_mode=AutoresetMode.SAME_STEP)
        observations, _ = theirs.reset(seed=unit_seed(5, 0))
        np.testing.assert_array_equal(env.observations, observations.reshape(2, -1))
        for _ in range(20):
            env.step(np.ones(2, env.actions.dtype))
            observations, rewards, *_ = theirs.step(np.ones(2, np.int64))
            np.testing.assert_array_equal(env.observations, observations.reshape(2, -1))
        theirs.close()


def test_ale_vector_envs_past_the_first_get_seeds_it_takes():
    """A unit past the first gets a 63-bit seed (unit_seed); ALE's vector env takes 32-bit
    ones (seed + i for env i): the unit reduces it below 2**31 - n, so two units of one env
    each (what eval and render build) reset, and apart. Seeds under the bound pass as
    they are (the test above: unit 0, seed 5)."""
    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)
    factory = EnvFactory("gym-vec:ALE/Pong-v5", {"num_envs": 1, "num_threads": 1})
    assert unit_seed(0, 1) >= 1 << 31
    with pv.make(factory, backend="serial", num_envs=2, seed=0) as env:
        for _ in range(60):      # past the noop starts, which differ by seed
            env.step(np.zeros(2, env.actions.dtype))
        theirs = gym.make_vec("ALE/Pong-v5", num_envs=1, num_threads=1,
                              autoreset_mode=AutoresetMode.SAME_STEP)
        observations, _ = theirs.reset(seed=unit_seed(0, 1) % ((1 << 31) - 1))
        for _ in range(60):
            observations, *_ = theirs.step(np.zeros(1, np.int64))
        np.testing.assert_array_equal(env.observations[1], observations.reshape(-1))
        theirs.close()


def _lean_with_the_pole(observations):
    return (observations[:, 2] > 0).astype(np.int64)


@pytest.mark.parametrize("factory", ["any_env_toys:cartpole_vector_env",
                                     "any_env_toys:cartpole_native_batch"])
def test_eval_of_a_factory_holding_several_envs_counts_each_envs_first_episode(factory):
    """A factory whose env holds 4 envs (a VectorEnv, a native batch): evaluation makes
    whole ones (6 episodes: 8 envs) and averages the first episode of the first 6 envs,
    as stepping the same 8 envs by hand gives it; 9 episodes take a second round."""
    import any_env_toys  # noqa: F401  (importable: the factory's module)
    result = evaluate(factory, _lean_with_the_pole, episodes=6, seed=0)
    with pv.make(factory, backend="serial", num_envs=8, seed=0) as env:
        observations, _ = env.reset(seed=0)
        returns, lengths = np.zeros(8), np.zeros(8)
        first = np.full((8, 2), np.nan)
        while np.isnan(first[:6]).any():
            observations, rewards, terminals, truncations, _ = env.step(
                _lean_with_the_pole(observations).astype(env.actions.dtype))
            returns += rewards
            lengths += 1
            for row in np.flatnonzero((terminals | truncations) & np.isnan(first[:, 0])):
                first[row] = returns[row], lengths[row]
    assert result["episodes"] == 6
    assert result["mean"]["episode_return"] == pytest.approx(first[:6, 0].mean())
    assert result["mean"]["episode_length"] == pytest.approx(first[:6, 1].mean())
    assert len(set(first[:6, 1])) > 1, "the policy's episodes should differ in length"
    assert evaluate(factory, _lean_with_the_pole, episodes=9, num_envs=8, seed=0)["episodes"] == 9
