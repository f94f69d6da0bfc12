"""Prospector: C vs reference parity, game rules through set_state, the action
mask against what the step accepts, episode ends, bad input.

The state layout (flat float64) is reference.STATE_LAYOUT; tests build exact
scenarios by editing named fields of a state read from the C batch.
"""
import numpy as np
import pytest

import peregrine
from peregrine.envs.prospector import (BOOST, BRAKE, DOCK, MINE, NUM_ACTIONS, OBS_MASK, SCAN,
                                       SELL, SELL_ALL, THRUST, UNDOCK, UPGRADE, WAIT, WIDE_SCAN,
                                       Prospector, action_mask, action_names)
from peregrine.envs.prospector.reference import STATE_INDEX, STATE_SIZE, ProspectorReference
from peregrine.envs.prospector.scripted import ScriptedTrader, random_policy

I = STATE_INDEX


def make(num_envs=1, seed=0, **config):
    return peregrine.make("prospector", num_envs=num_envs, seed=seed, **config)


def mixed_actions(observations, rng, valid_share=0.8):
    """Mostly valid actions (so the game actually happens), some arbitrary ones."""
    valid = random_policy(observations, rng)
    arbitrary = rng.integers(0, NUM_ACTIONS, len(observations)).astype(np.int32)
    return np.where(rng.random(len(observations)) < valid_share, valid, arbitrary).astype(np.int32)


def edited(state, **fields):
    state = np.array(state, np.float64)
    for name, value in fields.items():
        state[I[name]] = value
    return state


def flying_state(env, **fields):
    """Instance 0's state, undocked, at rest, with every asteroid/storm moved far away."""
    state = env.get_state(0)
    world = env.config["world_size"]
    base = dict(x=50.0, y=50.0, vx=0.0, vy=0.0, docked=0, steps=0)
    for i in range(12):
        base.update({f"asteroid_{i}_x": 0.0, f"asteroid_{i}_y": 0.0, f"asteroid_{i}_timer": 0,
                     f"asteroid_{i}_scanned": 0})
    for m in range(3):
        base.update({f"storm_{m}_x": world, f"storm_{m}_y": world, f"storm_{m}_vx": 0.0,
                     f"storm_{m}_vy": 0.0, f"storm_{m}_radius": 1.0})
    for j in range(4):
        base.update({f"station_{j}_x": 10.0 + 2 * j, f"station_{j}_y": 90.0})
    base.update(fields)
    return edited(state, **base)


def step_one(env, action):
    actions = np.zeros(env.num_envs, np.int32)
    actions[0] = action
    observations, rewards, terminals, truncations, _ = env.step(actions)
    return observations[0].copy(), float(rewards[0]), bool(terminals[0]), bool(truncations[0])


# ---- parity ------------------------------------------------------------------

PARITY_CONFIGS = [
    ({}, 1200),
    # a busy belt: small world, short respawns, strong storms and market, short episodes
    (dict(world_size=30, respawn_delay=3, storm_damage=5, storm_speed=2, price_volatility=0.5,
          price_reversion=0.3, sale_impact=0.2, max_steps=150, start_credits=2000,
          upgrade_cost=100, ore_min=0.5, ore_max=3, cargo_shaping=1.0), 800),
]


@pytest.mark.parametrize("config,steps", PARITY_CONFIGS)
def test_c_and_reference_agree_over_long_random_rollouts(config, steps):
    num_envs = 6
    env = make(num_envs, seed=11, **config)
    ref = ProspectorReference(num_envs, seed=11, **config)
    np.testing.assert_array_equal(env.observations, ref.observations)
    rng = np.random.default_rng(1)
    trader = ScriptedTrader(**config)
    ended = 0
    for t in range(steps):
        # half the instances trade (so selling, refuelling, repairs happen),
        # the others act at random, sometimes invalidly
        actions = np.where(np.arange(num_envs) % 2 == 0, trader(env.observations),
                           mixed_actions(env.observations, rng)).astype(np.int32)
        obs, rewards, terminals, truncations, _ = env.step(actions)
        ref_obs, ref_rewards, ref_terminals, ref_truncations, _ = ref.step(actions)
        np.testing.assert_allclose(obs, ref_obs, rtol=1e-5, atol=1e-5, err_msg=f"step {t}")
        np.testing.assert_allclose(rewards, ref_rewards, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(terminals, ref_terminals)
        np.testing.assert_array_equal(truncations, ref_truncations)
        done = terminals | truncations
        np.testing.assert_allclose(env.final_observations[done], ref.final_observations[done],
                                   rtol=1e-5, atol=1e-5)
        ended += int(done.sum())
    for i in range(num_envs):
        np.testing.assert_allclose(env.get_state(i), ref.get_state(i), rtol=1e-5, atol=1e-5)
    assert ended > 0 and len(ref.episodes) == ended
    stats = env.episode_stats()
    assert stats.count == ended
    assert stats.mean["ore_sold"] > 0 and stats.mean["ore_mined"] > 0
    for name in stats.mean:
        expected = np.mean([episode[name] for episode in ref.episodes])
        assert stats.mean[name] == pytest.approx(expected, rel=1e-5, abs=1e-5), name
    env.close()


def test_parity_from_identical_mid_game_states():
    """Load C states into the reference and step both from there."""
    env = make(8, seed=3)
    rng = np.random.default_rng(2)
    trader = ScriptedTrader()
    for _ in range(150):  # get somewhere interesting: cargo, docking, scans
        env.step(np.where(rng.random(8) < 0.7, trader(env.observations),
                          mixed_actions(env.observations, rng)).astype(np.int32))
    ref = ProspectorReference(8, seed=99)
    for i in range(8):
        ref.set_state(i, env.get_state(i))
    np.testing.assert_array_equal(env.observations, ref.observations)
    for _ in range(5):  # the streams differ, so only until the market draws matter
        actions = mixed_actions(env.observations, rng)
        obs, *_ = env.step(actions)
        ref_obs, *_ = ref.step(actions)
        ship = slice(0, 24)
        np.testing.assert_array_equal(obs[:, ship], ref_obs[:, ship])


# ---- the mask matches what the step accepts ------------------------------------

def sample_states(count, seed=0):
    env = make(4, seed=seed, price_volatility=0.0)
    rng = np.random.default_rng(seed)
    trader = ScriptedTrader()
    states = []
    for t in range(count * 25):
        scripted = trader(env.observations)
        env.step(np.where(rng.random(4) < 0.6, scripted, mixed_actions(env.observations, rng)))
        if t % 25 == 24:
            states.append(env.get_state(t // 25 % 4))
    env.close()
    return states


def test_masked_actions_are_exactly_wait_and_valid_ones_have_an_effect():
    """Every action from the same state side by side (one instance each): an
    invalid action leaves the state exactly as wait does (time passes, the
    ship drifts, idle fuel burns) except the invalid-action counters; a valid
    one changes something. Volatility 0 makes the market deterministic."""
    env = make(NUM_ACTIONS, seed=0, price_volatility=0.0)
    seen_valid = np.zeros(NUM_ACTIONS, bool)
    seen_invalid = np.zeros(NUM_ACTIONS, bool)
    states = sample_states(60)
    # plus crafted variants where the rarer actions are valid: docked with cargo,
    # credits and damage; flying beside a scanned asteroid with some cargo
    for state in states[:10]:
        states.append(edited(state, docked=1, x=state[I["station_0_x"]], y=state[I["station_0_y"]],
                             vx=0, vy=0, cargo_0=2, cargo_1=2, cargo_2=2, cargo_3=2,
                             hold_level=0, credits=1000, hull=50, fuel=50))
        states.append(edited(state, docked=0, cargo_0=1, cargo_1=1, cargo_2=1, cargo_3=1,
                             hold_level=0, asteroid_5_x=state[I["x"]], asteroid_5_y=state[I["y"]],
                             asteroid_5_scanned=1, asteroid_5_timer=0, asteroid_5_ore=5,
                             vx=0.1, vy=0))
    for state in states:
        if (state[[I[f"asteroid_{i}_timer"] for i in range(12)]] == 1).any():
            continue  # a respawn this step would draw from per-instance streams
        for instance in range(NUM_ACTIONS):
            env.set_state(instance, state)
        mask = action_mask(env.observations[0])
        assert mask[WAIT]
        env.step(np.arange(NUM_ACTIONS, dtype=np.int32))
        after = np.array([env.get_state(a) for a in range(NUM_ACTIONS)])
        counters = [I["last_invalid"], I["invalid_actions"]]
        others = np.setdiff1d(np.arange(STATE_SIZE), counters)
        for a in range(1, NUM_ACTIONS):
            if env.terminals[a] or env.truncations[a] or env.terminals[0] or env.truncations[0]:
                continue
            if mask[a]:
                seen_valid[a] = True
                assert not np.array_equal(after[a][others], after[0][others]), action_names()[a]
                assert after[a][I["last_invalid"]] == 0
            else:
                seen_invalid[a] = True
                np.testing.assert_array_equal(after[a][others], after[0][others],
                                              err_msg=action_names()[a])
                assert after[a][I["last_invalid"]] == 1
                assert after[a][I["invalid_actions"]] == after[0][I["invalid_actions"]] + 1
    # the sampled states exercised both sides of most actions
    assert seen_invalid[1:].all()
    assert seen_valid.sum() >= 62, [action_names()[a] for a in np.flatnonzero(~seen_valid)]


def test_mask_block_and_helper():
    env = make(16, seed=0)
    mask = action_mask(env.observations)
    assert mask.shape == (16, NUM_ACTIONS) and mask.dtype == bool
    np.testing.assert_array_equal(mask, env.observations[:, OBS_MASK] == 1.0)
    np.testing.assert_array_equal(mask, env.action_mask())
    assert set(np.unique(env.observations[:, OBS_MASK])) <= {0.0, 1.0}
    # everyone starts docked: undock valid, flying actions not
    assert mask[:, UNDOCK].all() and not mask[:, THRUST:BRAKE + 1].any()
    assert not mask[:, SELL_ALL].any()  # empty hold
    with pytest.raises(ValueError, match="260"):
        action_mask(np.zeros((4, 259), np.float32))
    assert len(action_names()) == NUM_ACTIONS


# ---- rules -----------------------------------------------------------------------

def test_mining_depletes_an_asteroid_which_respawns_later():
    env = make(1, seed=0, drill_base=1.0, respawn_delay=5, price_volatility=0.0)
    state = flying_state(env, asteroid_0_x=51.0, asteroid_0_y=51.0, asteroid_0_ore=2.5,
                         asteroid_0_type=2, asteroid_0_scanned=1)
    env.set_state(0, state)
    mined = []
    for _ in range(3):
        assert action_mask(env.observations[0])[MINE + 0]
        step_one(env, MINE + 0)
        mined.append(env.get_state(0)[I["cargo_2"]])
    assert mined == [1.0, 2.0, 2.5]  # drill rate 1, the last bite is what was left
    after = env.get_state(0)
    assert after[I["asteroid_0_ore"]] == 0 and after[I["asteroid_0_timer"]] == 5 - 1
    obs = env.observations[0]
    assert obs[24 + 2] == 0.0  # no longer active
    assert not action_mask(obs)[MINE + 0] and not action_mask(obs)[SCAN + 0]
    for _ in range(4):
        step_one(env, WAIT)
    respawned = env.get_state(0)
    assert respawned[I["asteroid_0_timer"]] == 0 and respawned[I["asteroid_0_scanned"]] == 0
    assert respawned[I["asteroid_0_ore"]] >= env.config["ore_min"]


def test_cargo_shaping_pays_the_base_value_when_mining_and_is_off_by_default():
    rock = dict(asteroid_0_x=51.0, asteroid_0_y=51.0, asteroid_0_ore=10.0, asteroid_0_type=3,
                asteroid_0_scanned=1)
    for shaping, expected in ((0.0, 0.0), (1.0, 1.0 * 32 * 0.01)):  # 1 unit of platinum
        env = make(1, seed=0, cargo_shaping=shaping, reward_scale=0.01)
        env.set_state(0, flying_state(env, **rock))
        _, reward, *_ = step_one(env, MINE + 0)
        assert reward == pytest.approx(expected, abs=1e-7)
    assert Prospector.default_config()["cargo_shaping"] == 0


def test_mining_needs_a_scan_range_and_hold_space():
    env = make(1, seed=0)
    base = dict(asteroid_0_x=51.0, asteroid_0_y=51.0, asteroid_0_ore=10.0, asteroid_0_type=0)
    env.set_state(0, flying_state(env, asteroid_0_scanned=0, **base))
    mask = action_mask(env.observations[0])
    assert not mask[MINE] and mask[SCAN] and mask[WIDE_SCAN]
    step_one(env, SCAN + 0)
    assert env.get_state(0)[I["asteroid_0_scanned"]] == 1
    assert action_mask(env.observations[0])[MINE]
    env.set_state(0, flying_state(env, asteroid_0_scanned=1, **dict(base, asteroid_0_x=60.0)))
    assert not action_mask(env.observations[0])[MINE]  # 10 away, range 3
    env.set_state(0, flying_state(env, asteroid_0_scanned=1, cargo_1=20.0, **base))
    assert not action_mask(env.observations[0])[MINE]  # hold (20) full


def test_selling_pays_the_station_price_and_moves_it_down():
    env = make(1, seed=0, price_volatility=0.0, price_reversion=0.0, sale_impact=0.01)
    state = flying_state(env, docked=1, cargo_3=10.0, credits=0.0, x=10.0, y=90.0)
    env.set_state(0, state)
    price = state[I["station_0_price_3"]]
    assert action_mask(env.observations[0])[SELL + 3]
    _, reward, *_ = step_one(env, SELL + 3)
    after = env.get_state(0)
    assert after[I["cargo_3"]] == 0
    assert after[I["credits"]] == pytest.approx(10 * price, rel=1e-6)
    assert reward == pytest.approx(10 * price * env.config["reward_scale"], rel=1e-5)
    assert after[I["station_0_price_3"]] == pytest.approx(price * 0.9, rel=1e-5)
    assert not action_mask(env.observations[0])[SELL + 3]


def test_prices_stay_within_bounds_and_do_move():
    config = dict(price_volatility=1.0, price_reversion=0.0, price_min_frac=0.5, price_max_frac=2.0)
    env = make(32, seed=4, **config)
    rng = np.random.default_rng(0)
    ore_price = np.array([env.config[f"price_{o}"] for o in ("ice", "iron", "cobalt", "platinum")])
    price_columns = [I[f"station_{j}_price_{k}"] for j in range(4) for k in range(4)]
    seen = []
    for t in range(1500):
        env.step(mixed_actions(env.observations, rng))
        relative = env.observations[:, 132:168].reshape(32, 4, 9)[:, :, 3:7]
        assert (relative >= 0.5 - 1e-6).all() and (relative <= 2.0 + 1e-6).all()
        if t % 100 == 0:
            prices = np.array([env.get_state(i)[price_columns] for i in range(32)]).reshape(32, 4, 4)
            assert (prices >= 0.5 * ore_price - 1e-4).all() and (prices <= 2.0 * ore_price + 1e-4).all()
            seen.append(relative.copy())
    seen = np.array(seen)
    assert seen.std(axis=0).min() > 0  # every price moved
    assert (seen <= 0.5 + 1e-6).any() and (seen >= 2.0 - 1e-6).any()  # and hit both bounds


def test_prices_revert_to_the_station_base():
    env = make(1, seed=0, price_volatility=0.0, price_reversion=0.5)
    state = flying_state(env)
    base = state[I["station_2_base_1"]]
    env.set_state(0, edited(state, station_2_price_1=env.config["price_iron"] * 2.0))
    for _ in range(40):
        step_one(env, WAIT)
    assert env.get_state(0)[I["station_2_price_1"]] == pytest.approx(
        np.clip(base, 4.0, 16.0), rel=1e-4)


def test_storms_damage_the_hull_in_flight_but_not_docked():
    env = make(1, seed=0, storm_damage=3.0, shield_step=0.2)
    storm = dict(storm_0_x=50.0, storm_0_y=50.0, storm_0_radius=10.0)
    env.set_state(0, flying_state(env, hull=100.0, **storm))
    step_one(env, WAIT)
    assert env.get_state(0)[I["hull"]] == pytest.approx(97.0)
    assert env.observations[0, 22] == 1.0  # "inside a storm" flag
    env.set_state(0, flying_state(env, hull=100.0, shield_level=2, **storm))
    step_one(env, WAIT)
    assert env.get_state(0)[I["hull"]] == pytest.approx(100.0 - 3.0 * 0.6)
    env.set_state(0, flying_state(env, hull=100.0, docked=1, **storm))
    step_one(env, WAIT)
    assert env.get_state(0)[I["hull"]] == 100.0


def test_fast_collisions_damage_the_hull_and_bounce_slow_ones_do_not():
    env = make(1, seed=0, collision_damage=5.0, safe_speed=0.5, drag=1.0)
    rock = dict(asteroid_0_x=51.0, asteroid_0_y=50.0, asteroid_0_ore=10.0)
    env.set_state(0, flying_state(env, hull=100.0, vx=1.0, **rock))
    step_one(env, WAIT)
    after = env.get_state(0)
    assert after[I["hull"]] == pytest.approx(100.0 - 5.0 * 1.0)
    assert after[I["vx"]] == pytest.approx(-0.5)
    env.set_state(0, flying_state(env, hull=100.0, vx=0.4, x=50.5, **rock))
    step_one(env, WAIT)
    assert env.get_state(0)[I["hull"]] == 100.0


def test_destruction_is_terminal():
    env = make(1, seed=0, storm_damage=50.0, death_penalty=1.0)
    env.set_state(0, flying_state(env, hull=10.0, storm_0_x=50.0, storm_0_y=50.0,
                                  storm_0_radius=5.0))
    _, reward, terminal, truncated = step_one(env, WAIT)
    assert terminal and not truncated and reward == pytest.approx(-1.0)
    assert env.final_observations[0, 5] == 0.0  # hull
    assert env.observations[0, 5] == 1.0 and env.observations[0, 13] == 1.0  # reset, docked
    stats = env.episode_stats()
    assert stats.count == 1 and stats.mean["destroyed"] == 1 and stats.mean["out_of_fuel"] == 0


def test_running_out_of_fuel_is_terminal():
    env = make(1, seed=0, idle_fuel=0.02, thrust_fuel=0.3, death_penalty=2.0)
    env.set_state(0, flying_state(env, fuel=0.5))
    _, reward, terminal, _ = step_one(env, THRUST + 2)  # 0.3 + 0.02 burnt
    assert not terminal
    assert env.get_state(0)[I["fuel"]] == pytest.approx(0.18, abs=1e-6)
    _, reward, terminal, truncated = step_one(env, BOOST + 2)  # costs 1.0 > 0.18 left
    assert terminal and not truncated and reward == pytest.approx(-2.0)
    assert env.final_observations[0, 4] == 0.0
    stats = env.episode_stats()
    assert stats.mean["out_of_fuel"] == 1 and stats.mean["destroyed"] == 0
    # an idle ship in flight runs dry too, a docked one does not
    env.set_state(0, flying_state(env, fuel=0.01))
    assert step_one(env, WAIT)[2]
    env.set_state(0, flying_state(env, fuel=0.01, docked=1))
    assert not step_one(env, WAIT)[2]


def test_truncation_at_the_step_limit_keeps_the_final_observation():
    env = make(1, seed=0, max_steps=50)
    ref = ProspectorReference(1, seed=0, max_steps=50)
    state = flying_state(env, steps=49, vx=0.5)
    env.set_state(0, state)
    ref.set_state(0, state)
    _, reward, terminal, truncated = step_one(env, WAIT)
    ref.step(np.zeros(1, np.int32))
    assert truncated and not terminal
    final = env.final_observations[0]
    np.testing.assert_array_equal(final[:24], ref.final_observations[0, :24])
    assert final[21] == 0.0  # no time left
    assert final[0] == pytest.approx(50.5 / 100)  # the ship drifted before the end
    assert env.observations[0, 21] == 1.0 and env.get_state(0)[I["steps"]] == 0  # reset
    stats = env.episode_stats()
    assert stats.count == 1 and stats.mean["episode_length"] == 50


def test_docking_requires_range_and_low_speed_then_buying_fuel_costs_credits():
    env = make(1, seed=0, price_volatility=0.0)
    near = dict(x=11.0, y=89.0)  # station 0 at (10, 90)
    env.set_state(0, flying_state(env, vx=1.0, **near))
    assert not action_mask(env.observations[0])[DOCK]  # too fast
    env.set_state(0, flying_state(env, vx=0.1, **near))
    assert action_mask(env.observations[0])[DOCK]
    step_one(env, DOCK)
    state = env.get_state(0)
    assert state[I["docked"]] == 1 and state[I["vx"]] == 0
    mask = action_mask(env.observations[0])
    assert mask[UNDOCK] and not mask[THRUST:BRAKE + 1].any()
    fuel_price = state[I["station_0_fuel_price"]]
    env.set_state(0, edited(state, fuel=40.0, credits=100.0))
    step_one(env, 50)  # buy a quarter tank
    after = env.get_state(0)
    assert after[I["fuel"]] == pytest.approx(65.0)
    assert after[I["credits"]] == pytest.approx(100.0 - 25.0 * fuel_price, rel=1e-5)
    env.set_state(0, edited(state, fuel=40.0, credits=5.0))
    step_one(env, 51)  # fill: only what 5 credits buy
    after = env.get_state(0)
    assert after[I["credits"]] == pytest.approx(0.0, abs=1e-4)
    assert after[I["fuel"]] == pytest.approx(40.0 + 5.0 / fuel_price, rel=1e-5)


def test_upgrades_cost_credits_and_raise_levels():
    env = make(1, seed=0, upgrade_cost=100.0)
    state = flying_state(env, docked=1, credits=250.0)
    env.set_state(0, state)
    mask = action_mask(env.observations[0])
    assert mask[UPGRADE:UPGRADE + 3].all()
    step_one(env, UPGRADE)  # hold level 0 -> 1 costs 100
    after = env.get_state(0)
    assert after[I["hold_level"]] == 1 and after[I["credits"]] == pytest.approx(150.0)
    assert env.observations[0, 7] == pytest.approx(30 / 50)  # capacity 30 of max 50
    step_one(env, UPGRADE)  # level 1 -> 2 costs 200 > 150 left: masked, a no-op
    assert env.get_state(0)[I["hold_level"]] == 1 and env.observations[0, 23] == 1.0


# ---- state, config and input checks ------------------------------------------------

def test_state_round_trip_and_inconsistent_states_are_refused():
    env = make(2, seed=5)
    for _ in range(30):
        env.step(np.zeros(2, np.int32))
    state = env.get_state(1)
    obs = env.observations[1].copy()
    assert state.size == STATE_SIZE == env._batch.state_size
    env.set_state(1, state)
    np.testing.assert_array_equal(env.observations[1], obs)
    # a full hold whose float32 parts add up to the capacity only after rounding
    # (as mining leaves it) is a valid state
    full = edited(state, hold_level=0, cargo_0=0, cargo_1=float(np.float32(7.80011415)),
                  cargo_2=float(np.float32(12.19988632)), cargo_3=0)
    env.set_state(1, full)
    np.testing.assert_array_equal(env.get_state(1), full)
    env.set_state(1, state)
    for bad in (dict(docked=7), dict(cargo_0=1e4), dict(cargo_0=20.01), dict(steps=1000), dict(fuel=0.0),
                dict(hold_level=4), dict(asteroid_3_type=4), dict(station_0_price_0=1e6),
                dict(x=-1.0), dict(last_invalid=0.5)):
        with pytest.raises(ValueError):
            env.set_state(1, edited(state, **bad))
    np.testing.assert_array_equal(env.get_state(1), state)  # refused states change nothing


@pytest.mark.parametrize("fields,name", [
    (dict(storm_radius_min=20.0, storm_radius_max=10.0), "storm_radius_min"),
    (dict(ore_min=50.0, ore_max=40.0), "ore_min"),
    (dict(drag=1.5), "drag"),
    (dict(max_steps=0), "max_steps"),
    (dict(world_size=float("nan")), "world_size"),
    (dict(respawn_delay=2.5), "respawn_delay"),
    (dict(shield_step=0.5), "shield_step"),
])
def test_invalid_configs_name_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        make(2, **fields)


def test_native_binding_refuses_cross_field_errors_itself():
    from peregrine.envs.prospector import _prospector
    config = Prospector.default_config()
    config.update(ore_min=50.0, ore_max=40.0)
    with pytest.raises(ValueError, match="ore_min"):
        _prospector.describe([float(config[n]) for n in Prospector.config_field_names()])


def test_out_of_range_actions_are_refused_by_the_binding():
    env = make(4, seed=0)
    before = env.observations.copy()
    for bad in (NUM_ACTIONS, -1, 2**31 - 1):
        with pytest.raises(ValueError, match="out of range"):
            env._batch.step(np.full(4, bad, np.int32))
    np.testing.assert_array_equal(env.observations, before)


def test_no_nan_under_extreme_configs():
    extremes = [dict(world_size=10, max_speed=1000, thrust_accel=100, boost_factor=10, drag=1.0),
                dict(fuel_price=0, repair_price=0, start_credits=0, station_spread=0.9),
                dict(world_size=1e4, storm_speed=1e3, storm_radius_max=1e4, storm_damage=1e6),
                dict(price_volatility=1, price_reversion=1, price_max_frac=100, sale_impact=1)]
    rng = np.random.default_rng(0)
    for config in extremes:
        env = make(16, seed=1, **config)
        for _ in range(200):
            obs, rewards, *_ = env.step(mixed_actions(env.observations, rng, 0.5))
            assert np.isfinite(obs).all() and np.isfinite(rewards).all(), config
        env.close()


# ---- baselines --------------------------------------------------------------------

def test_scripted_trader_beats_random():
    from peregrine.evaluate import evaluate
    scripted = evaluate("prospector", "trader", episodes=32, seed=0, max_steps=300)
    random = evaluate("prospector", "random", episodes=32, seed=0, max_steps=300)
    assert scripted["episodes"] == random["episodes"] == 32
    assert scripted["mean"]["episode_return"] > random["mean"]["episode_return"] + 1.0
    assert scripted["mean"]["ore_sold"] > 0
    assert random["mean"]["episode_length"] <= 300
