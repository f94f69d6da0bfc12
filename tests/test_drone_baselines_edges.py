"""The scripted DroneSwarm baselines at their edges: planning parameters under
randomisation with and without choice lists, and a Voronoi plan with more drones
than search points."""
from __future__ import annotations

import numpy as np

import peregrine
from peregrine.envs.drone_swarm import DroneSwarm
from peregrine.envs.drone_swarm.baselines import VoronoiPolicy, effective_parameters

NO_CHOICES = {**{f"t_confirm_choice_{i}": -1 for i in range(4)},
              **{f"m_deliver_choice_{i}": -1 for i in range(4)}}


def test_randomised_worlds_are_planned_for_their_worst_draw():
    base = DroneSwarm.resolve_config({"randomise": 1, "t_confirm": 5, "m_deliver": 9,
                                      "t_confirm_choice_0": 2, "t_confirm_choice_1": 7,
                                      "m_deliver_choice_0": 12, "m_deliver_choice_1": 4,
                                      "t_confirm_choice_2": -1, "m_deliver_choice_2": -1,
                                      "r_comm_min": 10.0, "r_comm_max": 30.0,
                                      "p_comm_drop": 0.1, "p_comm_drop_max": 0.4})
    params = effective_parameters(base)
    assert (params["t_confirm"], params["t_confirm_min"]) == (7, 2)   # longest, shortest
    assert (params["m_deliver"], params["m_deliver_max"]) == (4, 12)  # shortest, longest
    assert params["r_comm"] == 10.0 and params["p_comm_drop"] == 0.4


def test_randomised_worlds_without_choice_lists_plan_with_the_fixed_values():
    config = DroneSwarm.resolve_config({"randomise": 1, "t_confirm": 5, "m_deliver": 9,
                                        **NO_CHOICES})
    params = effective_parameters(config)
    assert (params["t_confirm"], params["t_confirm_min"]) == (5, 5)
    assert (params["m_deliver"], params["m_deliver_max"]) == (9, 9)


def test_voronoi_with_more_drones_than_search_points_gives_every_drone_a_tour():
    config = {"n_drones": 12, "n_victims": 3, "world_size": 20.0, "r_sense": 40.0,
              "victim_min_dist": 0.0, "victim_max_dist": 10.0, "max_steps": 60}
    with peregrine.make("drone_swarm", num_envs=2, seed=1, **config) as env:
        policy = VoronoiPolicy()
        policy.reset(env)
        assert len(policy.seeds) == 12
        assert (policy.tour_length >= 1).all()
        # fewer distinct waypoints than drones: some cells were empty and keep their seed
        firsts = {tuple(np.round(w[0], 6)) for w in policy.waypoints}
        assert len(firsts) < 12
        observations = env.observations
        for _ in range(60):
            actions = policy(observations)
            assert actions.shape == (env.num_agents, 3) and np.isfinite(actions).all()
            observations, _, terminals, truncations, _ = env.step(actions.astype(np.float32))
            policy.observe_done(terminals, truncations)
        assert env.episode_stats().count >= 2         # the episodes ran to their end
