"""Scripted DroneSwarm policies: competent, batch-shaped, and using observations only."""
import numpy as np
import pytest

import peregrine
from peregrine.envs.drone_swarm.baselines import (HELP, POLICIES, LawnmowerPolicy, RandomPolicy,
                                                  VoronoiPolicy, effective_parameters)
from peregrine.envs.drone_swarm.reference import decode_state, encode_state
from peregrine.envs.scripted import make_scripted_policy
from peregrine.evaluate import evaluate


@pytest.fixture(scope="module")
def random_stats():
    return evaluate("drone_swarm", "random", episodes=8, seed=3)


@pytest.mark.parametrize("name", ["lawnmower", "voronoi"])
def test_baseline_delivers_more_than_random(name, random_stats):
    stats = evaluate("drone_swarm", name, episodes=8, seed=3)
    assert stats["episodes"] == 8
    assert stats["mean"]["delivered"] > random_stats["mean"]["delivered"] + 5
    # competent, not just better: most victims get home and most episodes succeed
    assert stats["mean"]["delivered"] >= 9.0
    assert stats["mean"]["success"] >= 0.75
    assert stats["mean"]["time_to_first_delivery"] < random_stats["mean"]["time_to_first_delivery"]


@pytest.mark.parametrize("name", ["lawnmower", "voronoi"])
def test_baseline_copes_with_a_shifted_preset(name):
    stats = evaluate("drone_swarm", name, episodes=4, seed=1, preset="short_radio")
    assert stats["mean"]["delivered"] >= 8.0


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("config", [{}, {"obs_n_nearest": 0}, {"obs_n_nearest": 8},
                                    {"n_drones": 1}, {"n_drones": 64, "n_victims": 3}])
def test_actions_are_float32_rows_in_range(name, config):
    env = peregrine.make("drone_swarm", num_envs=3, seed=0, **config)
    try:
        policy = make_scripted_policy("drone_swarm", name, env, seed=0)
        observations = env.observations
        for _ in range(40):
            actions = policy(observations)
            assert actions.dtype == np.float32 and actions.shape == (env.num_agents, 3)
            assert np.all(np.isfinite(actions)) and np.all(np.abs(actions) <= 1.0)
            observations, _, terminals, truncations, _ = env.step(actions)
            policy.observe_done(terminals, truncations)
    finally:
        env.close()


def test_unknown_policy_name_is_refused():
    with pytest.raises(ValueError, match="lawnmower"):
        make_scripted_policy("drone_swarm", "spiral", env=None)    # refused before binding


def _scenario(num_drones, drones_xy, victim_xy, **config):
    """One instance with the given drone and victim positions (step 0, fresh episode)."""
    env = peregrine.make("drone_swarm", num_envs=1, seed=0, n_drones=num_drones, n_victims=1, **config)
    state = decode_state(env.get_state(0), env.config)
    state["drones"]["x"][:] = [p[0] for p in drones_xy]
    state["drones"]["y"][:] = [p[1] for p in drones_xy]
    state["drones"]["connected"][:] = 0
    state["victims"]["x"][:] = victim_xy[0]
    state["victims"]["y"][:] = victim_xy[1]
    env.set_state(0, encode_state(state, env.config))
    return env


def _run(env, policy, steps):
    modes = []
    observations = env.observations
    for _ in range(steps):
        observations, _, terminals, truncations, _ = env.step(policy(observations))
        policy.observe_done(terminals, truncations)
        modes.append(policy.mode.copy())
        if terminals.any() or truncations.any():
            break
    return terminals.any(), np.array(modes)


def test_drone_confirms_then_brings_the_report_home():
    # victim 30 from the base: one drone stops on it, scans, then flies back in range
    env = _scenario(1, [(78.0, 50.0)], (80.0, 50.0))
    policy = VoronoiPolicy()
    policy.reset(env)
    ended, _ = _run(env, policy, 200)
    stats = env.episode_stats()
    env.close()
    assert ended and stats.count == 1
    assert stats.mean["delivered"] == 1.0 and stats.mean["success"] == 1.0


def test_far_victim_gets_a_relay_chain():
    # victim 45 from the base with a 6-step delivery window: a lone drone cannot
    # get the report home in time, so idle drones become relays first
    drones = [(90.0, 50.0), (50.0, 52.0), (52.0, 50.0), (50.0, 48.0)]
    env = _scenario(4, drones, (95.0, 50.0), m_deliver=6)
    policy = VoronoiPolicy()
    policy.reset(env)
    ended, modes = _run(env, policy, 400)
    stats = env.episode_stats()
    env.close()
    assert ended and stats.mean["delivered"] == 1.0
    assert (modes == HELP).any(), "no drone was recruited as a relay"


def test_new_episodes_are_recognised_without_observe_done():
    env = peregrine.make("drone_swarm", num_envs=4, seed=5)
    policy = LawnmowerPolicy()
    policy.reset(env)
    observations = env.observations
    finished = 0
    for _ in range(1600):
        observations, _, terminals, truncations, _ = env.step(policy(observations))
        finished += int((terminals | truncations).sum()) // env.agents_per_env
        if finished >= 8:
            break
    stats = env.episode_stats()
    env.close()
    assert stats.count >= 8 and stats.mean["delivered"] >= 9.0


def test_randomised_config_is_planned_conservatively():
    config = peregrine.make("drone_swarm", num_envs=1, seed=0, preset="randomised").config
    params = effective_parameters(config)
    assert params["r_comm"] == config["r_comm_min"]
    assert params["t_confirm"] == 6 and params["t_confirm_min"] == 3
    assert params["m_deliver"] == 10 and params["m_deliver_max"] == 25


def test_random_policy_is_seeded():
    env = peregrine.make("drone_swarm", num_envs=2, seed=0)
    a, b = RandomPolicy(seed=7), RandomPolicy(seed=7)
    a.reset(env)
    b.reset(env)
    np.testing.assert_array_equal(a(env.observations), b(env.observations))
    env.close()


@pytest.mark.parametrize("name", ["lawnmower", "voronoi"])
def test_baselines_go_round_obstacles(name):
    # 6 obstacles up to 25 units; without detours a drone pressed against a wall stays there
    stats = evaluate("drone_swarm", name, episodes=8, seed=5, preset="wilderness_obstacles_hard")
    assert stats["mean"]["delivered"] >= 7.5 and stats["mean"]["success"] >= 0.6


def test_obstacles_are_remembered_from_the_observations():
    env = peregrine.make("drone_swarm", num_envs=4, seed=2, preset="wilderness_obstacles_hard")
    policy = make_scripted_policy("drone_swarm", "voronoi", env)
    policy(env.observations)
    for e in range(4):
        table = decode_state(env.get_state(e), env.config)["obstacles"]
        truth = table[table[:, 0] == 1, 1:]
        known = policy.known[e, :policy.known_count[e]]
        assert 0 < len(known) <= len(truth)
        # every remembered obstacle is a real one, up to float32 rounding of the slots
        assert (np.abs(known[:, None, :] - truth[None]).max(-1).min(1) < 1e-3).all()
    env.close()


def test_a_blocked_path_goes_via_a_reachable_corner():
    env = peregrine.make("drone_swarm", num_envs=1, seed=0, preset="wilderness_obstacles")
    policy = make_scripted_policy("drone_swarm", "voronoi", env)
    env.close()
    policy.known[0, 0] = (40.0, 40.0, 50.0, 80.0)
    policy.known_count[0] = 1
    pos = np.zeros((1, policy.n, 2))
    goal = np.zeros((1, policy.n, 2))
    pos[0, :] = (30.0, 60.0)
    goal[0, :] = (60.0, 62.0)
    goal[0, 1] = (35.0, 62.0)                       # drone 1: nothing in the way
    via = policy._navigate(pos, goal)
    g = policy.detour_clearance
    assert tuple(via[0, 0]) in {(40.0 - g, 40.0 - g), (40.0 - g, 80.0 + g)}
    assert tuple(via[0, 1]) == (35.0, 62.0)
    # a goal inside the obstacle is pushed out to its nearest side
    goal[0, 1] = (41.0, 70.0)
    assert tuple(policy._navigate(pos, goal)[0, 1]) == (40.0 - g, 70.0)
