"""CartPole: the C batch against Gymnasium CartPole-v1 and against the NumPy reference."""
import gymnasium
import numpy as np
import pytest

import peregrine
from peregrine.envs.cartpole.reference import CartPoleReference

THETA_LIMIT = 12 * 2 * np.pi / 360


def random_states(rng, count):
    """Uniform states plus states straddling both termination thresholds."""
    states = rng.uniform([-2.4, -3, -THETA_LIMIT, -3.5], [2.4, 3, THETA_LIMIT, 3.5], (count, 4))
    near = count // 3
    states[:near, 0] = rng.choice([-1, 1], near) * (2.4 + rng.uniform(-0.05, 0.05, near))
    states[near:2 * near, 2] = rng.choice([-1, 1], near) * (THETA_LIMIT + rng.uniform(-0.01, 0.01, near))
    return states.astype(np.float32)


def test_matches_gymnasium_from_the_same_state_and_action():
    rng = np.random.default_rng(0)
    count = 3000
    states = random_states(rng, count)
    actions = rng.integers(0, 2, count).astype(np.int32)
    env = peregrine.make("cartpole", num_envs=count, seed=0)
    for i, state in enumerate(states):
        env.set_state(i, [*state, 0])
    observations, rewards, terminals, truncations, _ = env.step(actions)
    # a terminated row was reset; its next state is in final_observations
    next_states = np.where(terminals[:, None], env.final_observations, observations)

    reference = gymnasium.make("CartPole-v1").unwrapped
    reference.reset(seed=0)
    terminated_seen = 0
    for i in range(count):
        reference.state = states[i].astype(np.float64)
        reference.steps_beyond_terminated = None
        expected, reward, terminated, truncated, _ = reference.step(int(actions[i]))
        np.testing.assert_allclose(next_states[i], expected, atol=1e-5, rtol=0)
        assert rewards[i] == reward
        assert bool(terminals[i]) == terminated, (i, states[i], actions[i])
        assert not truncations[i] and not truncated
        terminated_seen += terminated
    assert 0.2 * count < terminated_seen < 0.8 * count  # the thresholds really were exercised


def test_matches_numpy_reference_bit_for_bit_over_long_rollouts():
    num_envs, seed = 64, 123
    env = peregrine.make("cartpole", num_envs=num_envs, seed=seed)
    reference = CartPoleReference(num_envs, seed=seed)
    np.testing.assert_array_equal(env.observations, reference.state)
    rng = np.random.default_rng(1)
    endings = 0
    for _ in range(2500):  # thousands of episodes with random actions
        actions = rng.integers(0, 2, num_envs).astype(np.int32)
        obs, rewards, terminals, truncations, _ = env.step(actions)
        ref_obs, ref_rewards, ref_terminals, ref_truncations, _ = reference.step(actions)
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(rewards, ref_rewards)
        np.testing.assert_array_equal(terminals, ref_terminals)
        np.testing.assert_array_equal(truncations, ref_truncations)
        ended = terminals | truncations
        np.testing.assert_array_equal(env.final_observations[ended], reference.final_observations[ended])
        endings += ended.sum()
    stats = env.episode_stats()
    assert stats.count == endings == len(reference.episode_returns)
    assert stats.mean["episode_return"] == pytest.approx(np.mean(reference.episode_returns))
    assert stats.std["episode_return"] == pytest.approx(np.std(reference.episode_returns))


def test_truncation_at_max_steps_keeps_final_observation_and_is_not_terminal():
    env = peregrine.make("cartpole", num_envs=4, seed=0, max_steps=500)
    balanced = [0.0, 0.0, 0.0, 0.0]
    for i in range(4):
        env.set_state(i, [*balanced, 499])  # one step left
    # pushing right then left from rest cannot fail in one step
    obs, rewards, terminals, truncations, _ = env.step(np.array([1, 0, 1, 0], np.int32))
    assert truncations.all() and not terminals.any()
    # final observation is the state after the push, not the fresh reset
    assert np.all(np.abs(env.final_observations[:, 1]) > 0.1)      # cart velocity from the push
    assert np.all(np.abs(obs) <= 0.05)                              # reset state
    assert not np.array_equal(obs, env.final_observations)
    stats = env.episode_stats()
    assert stats.count == 4 and stats.mean["episode_length"] == 500


def test_random_policy_return_matches_gymnasium_statistics():
    env = peregrine.make("cartpole", num_envs=1024, seed=7)
    rng = np.random.default_rng(0)
    for _ in range(300):
        env.step(rng.integers(0, 2, 1024).astype(np.int32))
    stats = env.episode_stats()
    # a uniformly random policy lasts ~22 steps on CartPole-v1
    assert stats.count > 10000
    assert 20.0 < stats.mean["episode_return"] < 24.5
