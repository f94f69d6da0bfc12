"""DroneSwarm C vs reference on configs the main parity table leaves out: randomised
episodes without choice lists (the fixed t_confirm/m_deliver), the found reward not
divided by n, and obstacle observation slots in a world without obstacles."""
from __future__ import annotations

import pytest

from test_drone_swarm import run_parity

NO_CHOICES = {**{f"t_confirm_choice_{i}": -1 for i in range(4)},
              **{f"m_deliver_choice_{i}": -1 for i in range(4)}}

CONFIGS = {
    "randomised_without_choice_lists": ({"randomise": 1, "t_confirm": 2, "m_deliver": 7,
                                         "max_steps": 120, **NO_CHOICES}, 3),
    "found_reward_not_divided": ({"r_found_divide_by_n": 0, "victim_max_dist": 25.0,
                                  "victim_min_dist": 0.0, "t_confirm": 2, "max_steps": 150}, 3),
    "obstacle_slots_without_obstacles": ({"n_obstacles": 0, "obs_n_obstacles": 2,
                                          "max_steps": 100}, 3),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parity_on_more_configs(name):
    config, num_envs = CONFIGS[name]
    stats = run_parity(config, num_envs)
    if name == "found_reward_not_divided":
        assert stats.mean["confirmed"] > 0      # the undivided reward was paid
