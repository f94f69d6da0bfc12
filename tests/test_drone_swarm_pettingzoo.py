"""DroneSwarm as a PettingZoo ParallelEnv (the `pettingzoo` extra)."""
import numpy as np
import pytest

import peregrine
from peregrine.envs import drone_swarm

pytest.importorskip("pettingzoo")
SMALL = {"n_drones": 3, "n_victims": 4, "max_steps": 40}


def test_passes_pettingzoo_parallel_api_and_seed_tests():
    from pettingzoo.test import parallel_api_test, parallel_seed_test
    env = drone_swarm.parallel_env(**SMALL)
    assert env.possible_agents == ["drone_0", "drone_1", "drone_2"]
    parallel_api_test(env, num_cycles=150)   # crosses several 40-step episodes
    parallel_seed_test(lambda: drone_swarm.parallel_env(**SMALL))
    env.close()


def test_steps_the_same_episodes_as_the_native_batch():
    env = drone_swarm.parallel_env(**SMALL)
    native = peregrine.make("drone_swarm", num_envs=1, seed=7, **SMALL)
    observations, _ = env.reset(seed=7)
    np.testing.assert_array_equal(np.stack([observations[a] for a in env.possible_agents]),
                                  native.observations)
    rng = np.random.default_rng(0)
    for step in range(SMALL["max_steps"]):
        assert env.agents == env.possible_agents
        batch = rng.uniform(-1, 1, native.actions.shape).astype(np.float32)
        observations, rewards, terminations, truncations, infos = env.step(
            {agent: batch[i] for i, agent in enumerate(env.possible_agents)})
        _, native_rewards, _, native_truncations, _ = native.step(batch)
        np.testing.assert_array_equal([rewards[a] for a in env.possible_agents], native_rewards)
        ended = native_truncations.any()
        expected = native.final_observations if ended else native.observations
        np.testing.assert_array_equal(np.stack([observations[a] for a in env.possible_agents]),
                                      expected)
        if ended:
            break
    assert step == SMALL["max_steps"] - 1 and all(truncations.values())
    assert not any(terminations.values()) and env.agents == []
    stats = native.episode_stats()
    assert infos["drone_0"]["episode"]["episode_length"] == SMALL["max_steps"]
    assert infos["drone_1"]["episode"]["episode_return"] == pytest.approx(
        stats.mean["episode_return"])
    with pytest.raises(RuntimeError, match="reset"):
        env.step({agent: np.zeros(3, np.float32) for agent in env.possible_agents})
    env.close()
    native.close()


def test_bad_actions_and_arguments_are_refused_by_name():
    env = drone_swarm.parallel_env(**SMALL)
    env.reset(seed=0)
    zeros = {agent: np.zeros(3, np.float32) for agent in env.agents}
    with pytest.raises(ValueError, match="missing \\['drone_2'\\]"):
        env.step({a: v for a, v in zeros.items() if a != "drone_2"})
    with pytest.raises(ValueError, match="unknown \\['drone_9'\\]"):
        env.step({**zeros, "drone_9": np.zeros(3)})
    with pytest.raises(ValueError, match="drone_1.*shape"):
        env.step({**zeros, "drone_1": np.zeros(2)})
    env.close()
    with pytest.raises(ValueError, match="render_mode"):
        drone_swarm.parallel_env(render_mode="ansi")
    with pytest.raises(ValueError, match="n_drones"):
        drone_swarm.parallel_env(n_drones=0)


def test_rgb_array_render():
    env = drone_swarm.parallel_env(render_mode="rgb_array", render_size=96, **SMALL)
    env.reset(seed=0)
    first = env.render()
    assert first.shape == (96, 96, 3) and first.dtype == np.uint8
    for _ in range(10):
        env.step({agent: np.array([1.0, 1.0, 0.0], np.float32) for agent in env.agents})
    assert not np.array_equal(first, env.render())   # the drones moved
    env.close()
    with pytest.warns(UserWarning, match="render_mode"):
        assert drone_swarm.parallel_env(**SMALL).render() is None
