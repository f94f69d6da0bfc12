"""Export: Peregrine envs as a Gymnasium 1.x VectorEnv and an SB3 VecEnv."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, VectorEnv

import peregrine.vector as pv

from test_vector_helpers import Squad


def test_gymnasium_vector_env_same_step_autoreset():
    env = pv.GymnasiumVectorEnv(pv.make("cartpole", num_envs=4, seed=0, max_steps=10),
                                autoreset_mode=AutoresetMode.SAME_STEP)
    with env:
        assert isinstance(env, VectorEnv)
        assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        assert env.num_envs == 4 and env.observation_space.shape == (4, 4)
        observations, infos = env.reset(seed=0)
        assert observations.shape == (4, 4) and infos == {}
        ended_once = False
        for step in range(12):
            actions = env.action_space.sample()  # int64 from Gymnasium: converted
            before = observations
            observations, rewards, terminations, truncations, infos = env.step(actions)
            assert observations is not before  # copies: safe to keep
            ended = terminations | truncations
            if ended.any():
                ended_once = True
                np.testing.assert_array_equal(infos["_final_obs"], ended)
                for row in range(4):
                    if ended[row]:
                        final = infos["final_obs"][row]
                        assert final.shape == (4,)
                        # the final observation is the state one step after `before`,
                        # and the returned observation is a fresh episode's first one
                        assert not np.array_equal(final, observations[row])
                        assert np.all(np.abs(observations[row]) <= 0.05)
                    else:
                        assert infos["final_obs"][row] is None
            else:
                assert "final_obs" not in infos
        assert ended_once


def test_gymnasium_vector_env_reports_masks_of_multi_agent_rows():
    inner = pv.make(lambda: Squad(limit=10), backend="serial", num_envs=1, seed=0)
    with pv.GymnasiumVectorEnv(inner) as env:
        env.reset(seed=0)
        env.step(np.zeros(3, np.int64))
        env.step(np.zeros(3, np.int64))
        _obs, _rew, _term, _trunc, infos = env.step(np.zeros(3, np.int64))
        assert infos["masks"].tolist() == [False, True, True]


def test_sb3_ppo_trains_on_native_cartpole():
    pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)
    vec_env = pv.sb3_vec_env(pv.make("cartpole", num_envs=8, seed=0))
    assert vec_env.num_envs == 8
    model = PPO("MlpPolicy", vec_env, n_steps=128, batch_size=256, n_epochs=4,
                learning_rate=1e-3, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=8 * 128 * 4)
    episodes = list(model.ep_info_buffer)
    assert len(episodes) > 20  # episode statistics flow through info["episode"]
    lengths = [info["l"] for info in episodes]
    assert all(1 <= length <= 500 for length in lengths)
    # it learned something: a random policy lasts ~22 steps on average
    assert np.mean(lengths[-20:]) > max(30, np.mean(lengths[:20]))
    vec_env.close()


def test_sb3_vec_env_infos():
    pytest.importorskip("stable_baselines3")
    vec_env = pv.sb3_vec_env(pv.make("cartpole", num_envs=2, seed=0, max_steps=5))
    vec_env.seed(3)
    observations = vec_env.reset()
    assert observations.shape == (2, 4)
    for _ in range(5):
        vec_env.step_async(np.array([0, 1]))
        observations, rewards, dones, infos = vec_env.step_wait()
        # on every row, as SB3's DummyVecEnv writes it; every end here is the 5-step limit
        assert [info["TimeLimit.truncated"] for info in infos] == dones.tolist()
    assert dones.all()
    for info in infos:
        assert info["terminal_observation"].shape == (4,)
        assert info["episode"]["l"] <= 5
    assert vec_env.get_attr("render_mode") == [None, None]
    assert vec_env.env_is_wrapped(object) == [False, False]
    vec_env.close()
