"""Prospector: every action from the same crafted states, in C and in the reference side
by side, gives bit-identical states (trading at a station with a full or empty purse,
mining into an almost full hold, docking out of range); and the reference refuses
bad actions and states as the C batch does."""
from __future__ import annotations

import numpy as np
import pytest

import peregrine
from peregrine.envs.prospector import NUM_ACTIONS
from peregrine.envs.prospector.reference import STATE_INDEX, STATE_SIZE, ProspectorReference

I = STATE_INDEX
CONFIG = dict(price_volatility=0.0)    # the market moves only by sales: no draws to compare


def edited(state, **fields):
    state = np.array(state, np.float64)
    for name, value in fields.items():
        state[I[name]] = value
    for i in range(12):         # no respawn this step (it would draw from the streams)
        if state[I[f"asteroid_{i}_timer"]] == 1:
            state[I[f"asteroid_{i}_timer"]] = 5
    return state


def crafted_states():
    with peregrine.make("prospector", num_envs=1, seed=7, **CONFIG) as env:
        start = env.get_state(0)
    station = dict(docked=1, x=start[I["station_0_x"]], y=start[I["station_0_y"]], vx=0, vy=0)
    asteroid = dict(asteroid_5_x=40.0, asteroid_5_y=40.0, asteroid_5_scanned=1,
                    asteroid_5_timer=0, asteroid_5_ore=5.0, x=40.0, y=40.0, vx=0.05, vy=0.0,
                    docked=0)
    return [
        # docked, every ore in the hold, rich, damaged, half empty tank: sell, buy, repair
        edited(start, **station, cargo_0=2, cargo_1=1.5, cargo_2=0.25, cargo_3=3,
               credits=1000, hull=40, fuel=30, hold_level=0),
        # docked and nearly broke: what is bought is what the purse affords
        edited(start, **station, cargo_0=0, cargo_1=0, cargo_2=0.5, cargo_3=0,
               credits=0.37, hull=20, fuel=5),
        # docked with nothing at all
        edited(start, **station, cargo_0=0, cargo_1=0, cargo_2=0, cargo_3=0, credits=0),
        # beside a scanned asteroid with the hold almost full: mining stops at the capacity
        edited(start, **asteroid, cargo_0=19.75, cargo_1=0, cargo_2=0, cargo_3=0, hold_level=0),
        # in open space, far from every station: dock finds nothing
        edited(start, docked=0, x=50.0, y=5.0, vx=0.0, vy=0.0,
               **{f"station_{j}_y": 95.0 for j in range(4)}),
    ]


@pytest.mark.parametrize("index", range(5))
def test_every_action_from_a_crafted_state_matches_the_reference(index):
    state = crafted_states()[index]
    env = peregrine.make("prospector", num_envs=NUM_ACTIONS, seed=3, **CONFIG)
    reference = ProspectorReference(NUM_ACTIONS, seed=3, **CONFIG)
    try:
        for instance in range(NUM_ACTIONS):
            env.set_state(instance, state)
            reference.set_state(instance, state)
        np.testing.assert_array_equal(env.observations, reference.observations)
        actions = np.arange(NUM_ACTIONS, dtype=np.int32)
        obs, rewards, terminals, truncations, _ = env.step(actions)
        ref_obs, ref_rewards, ref_terminals, ref_truncations, _ = reference.step(actions)
        for a in range(NUM_ACTIONS):
            np.testing.assert_array_equal(env.get_state(a), reference.get_state(a),
                                          err_msg=f"action {a}")
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(rewards, ref_rewards)
        np.testing.assert_array_equal(terminals, ref_terminals)
        np.testing.assert_array_equal(truncations, ref_truncations)
        # the crafted state matters: some actions changed it, in different ways
        after = {tuple(env.get_state(a)) for a in range(NUM_ACTIONS)}
        assert len(after) >= 3
    finally:
        env.close()


def test_the_reference_refuses_bad_actions_and_states():
    reference = ProspectorReference(2, seed=0)
    with pytest.raises(ValueError, match="actions must be 2 integers"):
        reference.step(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="actions must be 2 integers"):
        reference.step(np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=f"actions must be in 0..{NUM_ACTIONS - 1}"):
        reference.step(np.array([0, NUM_ACTIONS], np.int32))
    with pytest.raises(ValueError, match="actions must be in 0"):
        reference.step(np.array([-1, 0], np.int32))
    with pytest.raises(ValueError, match=f"state has {STATE_SIZE - 1} values, expected {STATE_SIZE}"):
        reference.set_state(0, np.zeros(STATE_SIZE - 1))


def test_a_reset_without_a_seed_keeps_the_streams_running():
    """reset(None) starts new episodes from where the streams are; reset(seed) restarts them."""
    reference = ProspectorReference(2, seed=5)
    first, _ = reference.reset(seed=5)
    again, _ = reference.reset()
    assert not np.array_equal(first, again)
    restarted, _ = reference.reset(seed=5)
    np.testing.assert_array_equal(first, restarted)
