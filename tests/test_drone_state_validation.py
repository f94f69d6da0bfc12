"""DroneSwarm states: the reference's `state_is_valid` and the C batch's `set_state`
accept and refuse the same states, one broken rule at a time (obstacles included)."""
from __future__ import annotations

import numpy as np
import pytest

import peregrine
from peregrine.envs.drone_swarm import OBSTACLE_FIELDS
from peregrine.envs.drone_swarm.reference import (DRONE_KEYS, VICTIM_KEYS, DroneSwarmReference,
                                                  state_is_valid)

CONFIG = dict(n_drones=3, n_victims=4, n_obstacles=2, obstacle_max_size=10.0, max_steps=200)


def drone(i, key):
    return ("drones", i * len(DRONE_KEYS) + DRONE_KEYS.index(key))


def victim(j, key):
    return ("victims", j * len(VICTIM_KEYS) + VICTIM_KEYS.index(key))


def obstacle(o, k):
    return ("obstacles", o * OBSTACLE_FIELDS + k)


# (what is broken, [(place, value), ...]) where place is an offset or (section, index)
BROKEN = [
    ("step past max_steps", [(0, 200)]),
    ("a fractional step", [(0, 3.5)]),
    ("r_comm of 0", [(1, 0.0)]),
    ("a drop probability above 1", [(2, 1.5)]),
    ("t_confirm of 0", [(3, 0)]),
    ("a negative m_deliver", [(4, -1)]),
    ("first delivery before -1", [(5, -2)]),
    ("a NaN", [(6, np.nan)]),
    ("a drone outside the world", [(drone(0, "x"), -0.5)]),
    ("a battery above 1", [(drone(1, "battery"), 1.5)]),
    ("connected = 2", [(drone(2, "connected"), 2)]),
    ("scanning = 0.5", [(drone(0, "scanning"), 0.5)]),
    ("a victim outside the world", [(victim(0, "y"), 1e5)]),
    ("victim status 3", [(victim(1, "status"), 3)]),
    ("an owner beyond the drones", [(victim(2, "owner"), 3)]),
    ("confirmed without an owner", [(victim(3, "status"), 1), (victim(3, "owner"), -1)]),
    ("ever_confirmed = 2", [(victim(0, "ever_confirmed"), 2)]),
    ("a negative visited word", [(("visited", 0), -1)]),
    ("obstacle present = 2", [(obstacle(0, 0), 2)]),
    ("an obstacle corner outside the world", [(obstacle(0, 0), 1), (obstacle(0, 3), -1.0)]),
]


def place_offset(layout, place):
    if isinstance(place, tuple):
        section, index = place
        return layout[section] + index
    return place


def valid_state(env):
    env.step(np.zeros((env.num_agents, 3), np.float32))
    return np.asarray(env.get_state(0), np.float64)


@pytest.fixture(scope="module")
def env():
    with peregrine.make("drone_swarm", num_envs=1, seed=2, **CONFIG) as batch:
        yield batch


def assert_refused_by_both(env, state, what):
    assert not state_is_valid(state, env.config), what
    with pytest.raises(ValueError, match="state"):
        env.set_state(0, state)


def test_a_valid_state_is_accepted_by_both(env):
    state = valid_state(env)
    assert state_is_valid(state, env.config)
    env.set_state(0, state)
    reference = DroneSwarmReference(1, seed=0, **env.config)
    reference.set_state(0, state)
    np.testing.assert_array_equal(np.asarray(reference.get_state(0)), state)
    with pytest.raises(ValueError, match="state values are inconsistent"):
        reference.set_state(0, np.where(np.arange(state.size) == 0, -1.0, state))
    with pytest.raises(ValueError, match=f"state has {state.size - 1} values"):
        reference.set_state(0, state[:-1])


@pytest.mark.parametrize("what, changes", BROKEN, ids=[what for what, _ in BROKEN])
def test_a_broken_rule_is_refused_by_both(env, what, changes):
    state = valid_state(env)
    layout = env.state_layout
    for place, value in changes:
        state[place_offset(layout, place)] = value
    assert_refused_by_both(env, state, what)


def test_a_state_of_another_size_is_refused_by_both(env):
    state = valid_state(env)
    assert not state_is_valid(state[:-1], env.config)
    with pytest.raises(ValueError):
        env.set_state(0, state[:-1])


def obstacle_state(env, rects, drone_at=None):
    state = valid_state(env)
    layout = env.state_layout
    for o, rect in enumerate(rects):
        values = (0, 0, 0, 0, 0) if rect is None else (1, *rect)
        for k, value in enumerate(values):
            state[layout["obstacles"] + o * OBSTACLE_FIELDS + k] = value
    for i in range(CONFIG["n_drones"]):      # drones parked in a corner, clear of the rectangles
        x, y = (1.0 + i, 1.0) if drone_at is None or i else drone_at
        state[place_offset(layout, drone(i, "x"))] = x
        state[place_offset(layout, drone(i, "y"))] = y
    return state


@pytest.mark.parametrize("what, rects, drone_at, valid", [
    ("two disjoint obstacles", [(20, 20, 30, 30), (40, 40, 50, 45)], None, True),
    ("one obstacle and an empty slot", [(20, 20, 30, 30), None], None, True),
    ("x0 not below x1", [(30, 20, 20, 30), None], None, False),
    ("overlapping obstacles", [(20, 20, 30, 30), (25, 25, 35, 35)], None, False),
    ("a drone inside an obstacle", [(20, 20, 30, 30), None], (25.0, 25.0), False),
    ("a drone on an obstacle's edge", [(20, 20, 30, 30), None], (20.0, 25.0), True),
])
def test_obstacle_rules_agree(env, what, rects, drone_at, valid):
    state = obstacle_state(env, rects, drone_at)
    if valid:
        assert state_is_valid(state, env.config), what
        env.set_state(0, state)
        np.testing.assert_array_equal(env.get_state(0), state)
    else:
        assert_refused_by_both(env, state, what)
