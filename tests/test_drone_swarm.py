"""DroneSwarm: C core vs NumPy reference, one scenario per rule, hostile input, bad configs.

Scenario tests build exact states with set_state (layout in the package
docstring) and run them through both implementations.
"""
import math

import numpy as np
import pytest

from peregrine.envs.drone_swarm import CONFIG_FIELDS, STAT_NAMES, DroneSwarm, _drone_swarm
from peregrine.envs.drone_swarm.reference import DroneSwarmReference, decode_state, encode_state

TOL = 1e-5


def policy_actions(rng, rows):
    """Random actions that scan more often than not, a few beyond [-1, 1]."""
    actions = rng.uniform(-1.3, 1.3, (rows, 3)).astype(np.float32)
    actions[:, 2] = np.where(rng.random(rows) < 0.7, np.abs(actions[:, 2]), actions[:, 2])
    return actions


def run_parity(config, num_envs, episodes=2, seed=7):
    """C vs reference: observations, rewards, flags, final observations, exact
    states, statistics, and the global states (current and final), bit for bit."""
    env = DroneSwarm(num_envs=num_envs, seed=seed, **config)
    ref = DroneSwarmReference(num_envs=num_envs, seed=seed, **config)
    np.testing.assert_allclose(env.observations, ref.observations, atol=TOL, rtol=0)
    env.enable_states()
    np.testing.assert_array_equal(env.states, ref.states)
    rng = np.random.default_rng(seed)
    steps = episodes * env.config["max_steps"] + 3
    for _ in range(steps):
        actions = policy_actions(rng, env.num_agents)
        obs, rewards, terminals, truncations, _ = env.step(actions)
        obs_r, rewards_r, terminals_r, truncations_r, _ = ref.step(actions)
        np.testing.assert_allclose(obs, obs_r, atol=TOL, rtol=0)
        np.testing.assert_allclose(rewards, rewards_r, atol=TOL, rtol=0)
        np.testing.assert_array_equal(terminals, terminals_r)
        np.testing.assert_array_equal(truncations, truncations_r)
        np.testing.assert_array_equal(env.states, ref.states)
        done = terminals | truncations
        if done.any():
            np.testing.assert_allclose(env.final_observations[done], ref.final_observations[done],
                                       atol=TOL, rtol=0)
            ended = done.reshape(num_envs, -1)[:, 0]
            np.testing.assert_array_equal(env.final_states[ended], ref.final_states[ended])
    for instance in range(num_envs):
        np.testing.assert_allclose(env.get_state(instance), ref.get_state(instance), atol=TOL, rtol=0)
    stats, stats_r = env.episode_stats(), ref.episode_stats()
    assert stats.count == stats_r.count >= episodes * num_envs
    for name in STAT_NAMES:
        assert stats.mean[name] == pytest.approx(stats_r.mean[name], rel=TOL, abs=TOL), name
        assert stats.std[name] == pytest.approx(stats_r.std[name], rel=TOL, abs=TOL), name
    env.close()
    return stats


PARITY_CONFIGS = {
    "default": ({}, 2),
    "obs_n_nearest_0": ({"obs_n_nearest": 0, "max_steps": 150}, 3),
    "obs_n_nearest_8": ({"obs_n_nearest": 8, "r_sense": 40.0, "max_steps": 150}, 3),
    "n_drones_1": ({"n_drones": 1, "max_steps": 150}, 4),
    # 18 instances of 64 drones span two of the C step's 1024-drone blocks
    "n_drones_64": ({"n_drones": 64, "n_victims": 128, "obs_n_nearest": 16, "max_steps": 25}, 18),
    "many_blocks": ({"max_steps": 30}, 300),
    "link_drops": ({"p_comm_drop": 0.3, "max_steps": 150}, 3),
    "randomised": ({"randomise": 1, "max_steps": 150}, 4),
    "batteries_run_out": ({"c_idle": 0.02, "max_steps": 200}, 3),
    # obstacles: the hard wilderness world, and many small ones with fast drones
    # (walls stop drones every few steps, many victims hidden)
    "obstacles_wilderness_hard": ({"preset": "wilderness_obstacles_hard", "max_steps": 150}, 4),
    "obstacles_dense_fast": ({"n_obstacles": 16, "obstacle_min_size": 3.0, "obstacle_max_size": 12.0,
                              "obstacle_separation": 0.0, "obs_n_obstacles": 4, "r_sense": 40.0,
                              "v_max": 9.0, "max_steps": 120}, 6),
    # the report column after the obstacle slots, with reports confirmed, delivered and lost
    "report_column": ({"preset": "wilderness_obstacles", "obs_report": 1, "m_deliver": 6,
                       "max_steps": 150}, 4),
    "report_and_drone_id": ({"obs_report": 1, "obs_drone_id": 1, "obs_n_nearest": 2,
                             "randomise": 1, "max_steps": 120}, 3),
    "every_tail_column": ({"preset": "wilderness_obstacles_hard", "obs_report": 1,
                           "obs_network": 1, "obs_drone_id": 1, "p_comm_drop": 0.2,
                           "max_steps": 120}, 3),
    "drone_id_one_drone": ({"obs_drone_id": 1, "n_drones": 1, "max_steps": 60}, 3),
    # neighbour slots after every other column, more slots than neighbours, links
    # dropped, batteries running out (dead drones are not heard), r_comm per episode
    "neighbours_every_column": ({"preset": "wilderness_obstacles", "obs_report": 1,
                                 "obs_network": 1, "obs_drone_id": 1, "obs_n_neighbours": 9,
                                 "p_comm_drop": 0.2, "randomise": 1, "c_idle": 0.004,
                                 "max_steps": 150}, 3),
    # a default world with reports in flight: 3 slots of 7 other drones
    "neighbours_reports": ({"obs_report": 1, "obs_n_neighbours": 3, "victim_min_dist": 0.0,
                            "victim_max_dist": 30.0, "r_confirm_radius": 6.0, "t_confirm": 2,
                            "m_deliver": 4, "max_steps": 150}, 4),
    "neighbours_64_drones": ({"n_drones": 64, "obs_n_neighbours": 16, "max_steps": 25}, 5),
}


@pytest.mark.parametrize("name", sorted(PARITY_CONFIGS))
def test_parity_with_reference(name):
    config, num_envs = PARITY_CONFIGS[name]
    stats = run_parity(config, num_envs)
    if name == "batteries_run_out":
        assert stats.mean["episode_length"] < 200  # terminal on empty batteries


def test_parity_with_confirmations_deliveries_and_lost_reports():
    # victims close to the base and easy to confirm, short delivery window:
    # every branch of phases 4-5 happens many times
    config = {"victim_min_dist": 0.0, "victim_max_dist": 25.0, "r_confirm_radius": 6.0,
              "t_confirm": 2, "m_deliver": 2, "r_comm": 12.0, "max_steps": 200}
    for report in (0, 1):
        stats = run_parity({**config, "obs_report": report}, 4)
        assert stats.mean["delivered"] > 0 and stats.mean["confirmed"] > stats.mean["delivered"] - 1
    # the owner-credit rewards on the same deliveries and losses
    run_parity({**config, "r_deliver_owner": 2.5, "r_report_lost": -1.5}, 4)


def test_spaces_rows_and_presets():
    for preset in DroneSwarm.presets:
        with DroneSwarm(num_envs=2, seed=0, preset=preset) as env:
            n = env.config["n_drones"]
            assert env.agents_per_env == n and env.num_agents == 2 * n
            assert env.obs_dim == 10 + 3 * env.config["obs_n_nearest"] \
                + 4 * env.config["obs_n_obstacles"] + env.config["obs_report"] \
                + 3 * env.config["obs_network"] + env.config["obs_drone_id"] \
                + 4 * env.config["obs_n_neighbours"]
            assert env.single_action_space.shape == (3,)
            obs, rewards, *_ = env.step(np.zeros((env.num_agents, 3), np.float32))
            assert np.isfinite(obs).all() and (np.abs(obs) <= 1).all()
    assert DroneSwarm(num_envs=1, seed=0).config["base_x"] == 50.0  # -1 means the centre
    with DroneSwarm(num_envs=2, seed=0, n_drones=5, obs_report=1, obs_drone_id=1) as env:
        for obs in (env.observations, env.step(np.ones((10, 3), np.float32))[0]):
            assert obs.shape[1] == 19 + 2
            np.testing.assert_array_equal(obs[:, -1], np.tile(np.arange(5) / 4, 2).astype(np.float32))


# ---- scenarios --------------------------------------------------------------

SCENARIO = {"n_drones": 4, "n_victims": 2, "max_steps": 100, "t_confirm": 3, "m_deliver": 3}


class Pair:
    """The C env and the reference driven from the same state, compared at every step."""

    def __init__(self, **overrides):
        config = {**SCENARIO, **overrides}
        self.env = DroneSwarm(num_envs=1, seed=0, **config)
        self.ref = DroneSwarmReference(num_envs=1, seed=0, **config)
        self.config = self.env.config
        self.n = self.config["n_drones"]
        self.state = decode_state(self.env.get_state(0), self.config)

    def place(self, drones=(), victims=(), **header):
        """drones / victims: sequences of dicts of fields to set (others kept)."""
        s = self.state
        for index, fields in drones:
            for key, value in fields.items():
                s["drones"][key][index] = value
        for index, fields in victims:
            for key, value in fields.items():
                s["victims"][key][index] = value
        for key, value in header.items():
            s[key] = value
        values = encode_state(s, self.config)
        self.env.set_state(0, values)
        self.ref.set_state(0, values)
        np.testing.assert_allclose(self.env.observations, self.ref.observations, atol=TOL)

    def step(self, actions):
        actions = np.asarray(actions, np.float32).reshape(self.n, 3)
        out = [a.copy() for a in self.env.step(actions)[:4]]
        out_r = self.ref.step(actions)[:4]
        for a, b in zip(out, out_r):
            np.testing.assert_allclose(a, b, atol=TOL)
        np.testing.assert_allclose(self.env.get_state(0), self.ref.get_state(0), atol=TOL)
        self.state = decode_state(self.env.get_state(0), self.config)
        return out


def parked(n, far=(5.0, 5.0)):
    """Every drone parked in a corner, idle, full battery (override per test)."""
    return [(d, {"x": far[0], "y": far[1] + d, "battery": 1.0}) for d in range(n)]


def test_relay_chain_connects_a_far_drone_and_a_dead_relay_breaks_it():
    pair = Pair()
    # base at (50, 50), r_comm 15: a chain 12 apart reaches x = 86
    chain = [(0, {"x": 62.0, "y": 50.0}), (1, {"x": 74.0, "y": 50.0}), (2, {"x": 86.0, "y": 50.0}),
             (3, {"x": 10.0, "y": 10.0})]
    victims = [(0, {"x": 95.0, "y": 95.0}), (1, {"x": 5.0, "y": 95.0})]
    pair.place(drones=chain, victims=victims)
    obs, *_ = pair.step(np.zeros(12))
    assert obs[:, 4].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert pair.state["drones"]["connected"].tolist() == [1, 1, 1, 0]
    assert pair.state["drones"]["last_comm_age"][3] == 1  # +1 per step cut off
    # the middle relay's battery is empty: it neither relays nor counts as a neighbour
    pair.place(drones=[(1, {"battery": 0.0})])
    obs, *_ = pair.step(np.zeros(12))
    assert obs[:, 4].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert obs[0, 6] == 0.0 and obs[2, 6] == 0.0  # no live neighbour within r_comm
    assert pair.state["drones"]["last_comm_age"].tolist() == [0, 1, 1, 2]


def scan_at(n, drone, scan=True):
    actions = np.zeros((n, 3), np.float32)
    actions[drone, 2] = 1.0 if scan else -1.0
    return actions


def test_confirmation_needs_consecutive_scans_by_the_same_drone():
    pair = Pair()
    far_victim = {"x": 90.0, "y": 90.0}  # > r_comm from the base: no delivery
    drones = [(0, {"x": 90.0, "y": 91.0}), (1, {"x": 90.0, "y": 88.5}),
              (2, {"x": 10.0, "y": 10.0}), (3, {"x": 12.0, "y": 10.0})]
    pair.place(drones=drones, victims=[(0, far_victim), (1, {"x": 5.0, "y": 95.0})])
    victims = lambda: pair.state["victims"]  # noqa: E731
    pair.step(scan_at(4, 0))
    pair.step(scan_at(4, 0))
    assert victims()["progress"][0] == 2 and victims()["confirm_drone"][0] == 0
    pair.step(scan_at(4, 0, scan=False))  # a step without scanning resets progress
    assert victims()["progress"][0] == 0 and victims()["confirm_drone"][0] == -1
    pair.step(scan_at(4, 0))
    pair.step(scan_at(4, 1))  # another drone takes over: progress restarts at 1
    assert victims()["progress"][0] == 1 and victims()["confirm_drone"][0] == 1
    pair.step(scan_at(4, 1))
    assert victims()["status"][0] == 0 and victims()["progress"][0] == 2
    _, rewards, *_ = pair.step(scan_at(4, 1))  # third consecutive scan by drone 1
    assert victims()["status"][0] == 1 and victims()["owner"][0] == 1
    assert victims()["window"][0] == pair.config["m_deliver"] - 1  # counted down: not connected
    assert rewards[1] - rewards[0] == pytest.approx(pair.config["r_confirm"], abs=0.5)
    stats_row = victims()["ever_confirmed"]
    assert stats_row.tolist() == [1, 0]


def test_nearest_scanning_drone_confirms_when_two_are_in_range():
    pair = Pair()
    drones = [(0, {"x": 90.0, "y": 92.0}), (1, {"x": 90.0, "y": 91.0}),
              (2, {"x": 10.0, "y": 10.0}), (3, {"x": 12.0, "y": 10.0})]
    pair.place(drones=drones, victims=[(0, {"x": 90.0, "y": 90.0}), (1, {"x": 5.0, "y": 95.0})])
    both = np.zeros((4, 3), np.float32)
    both[:2, 2] = 1.0
    pair.step(both)
    assert pair.state["victims"]["confirm_drone"][0] == 1


def test_report_expires_after_m_deliver_steps_without_a_link():
    pair = Pair(m_deliver=3)
    drones = [(0, {"x": 90.0, "y": 90.0}), (1, {"x": 10.0, "y": 10.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    confirmed = {"x": 91.0, "y": 90.0, "status": 1, "owner": 0, "window": 3, "ever_confirmed": 1}
    pair.place(drones=drones, victims=[(0, confirmed), (1, {"x": 5.0, "y": 95.0})])
    for window in (2, 1, 0):
        pair.step(np.zeros(12))
        assert pair.state["victims"]["status"][0] == 1 and pair.state["victims"]["window"][0] == window
    pair.step(np.zeros(12))  # m_deliver steps after confirmation without a link: lost
    v = pair.state["victims"]
    assert v["status"][0] == 0 and v["owner"][0] == -1 and v["ever_confirmed"][0] == 1


def test_report_column_shows_the_owners_most_urgent_report_until_it_ends():
    pair = Pair(m_deliver=3, obs_report=1)
    drones = [(0, {"x": 90.0, "y": 90.0}), (1, {"x": 10.0, "y": 10.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    older = {"x": 91.0, "y": 90.0, "status": 1, "owner": 0, "window": 1, "ever_confirmed": 1}
    newer = {"x": 89.0, "y": 90.0, "status": 1, "owner": 0, "window": 3, "ever_confirmed": 1}
    pair.place(drones=drones, victims=[(0, older), (1, newer)])
    column = pair.env.observations[:, -1]
    assert column[0] == pytest.approx(2 / 4) and (column[1:] == 0).all()   # (1 + 1) / (3 + 1)
    seen = []
    for _ in range(5):
        obs = pair.step(np.zeros(12))[0]
        seen.append(float(obs[0, -1]))
        assert (obs[1:, -1] == 0).all()
    # the older report is lost after two more steps, then the newer one shows, then none
    assert seen == pytest.approx([1 / 4, 2 / 4, 1 / 4, 0.0, 0.0])


def test_network_columns_point_at_the_nearest_base_or_connected_drone():
    pair = Pair(obs_network=1, r_comm=15.0)
    # drone 0 links to the base (at 50, 50); drone 1 to drone 0; drone 2 is cut off
    # but nearer to drone 1 than to the base; drone 3 is nearer to the cut-off drone 2
    # than to anything connected
    drones = [(0, {"x": 50.0, "y": 62.0, "connected": 1}), (1, {"x": 50.0, "y": 75.0, "connected": 1}),
              (2, {"x": 50.0, "y": 95.0, "connected": 0}), (3, {"x": 70.0, "y": 95.0, "connected": 0})]
    pair.place(drones=drones)
    cols = pair.env.observations[:, -3:]
    np.testing.assert_array_equal(pair.env.observations[:, 4], [1, 1, 0, 0])   # connected
    np.testing.assert_allclose(cols[0], [0, -1, 12 / 100], atol=1e-6)    # the base (drone 1 is 13 away)
    np.testing.assert_allclose(cols[1], [0, -1, 13 / 100], atol=1e-6)    # drone 0
    np.testing.assert_allclose(cols[2], [0, -1, 20 / 100], atol=1e-6)    # drone 1
    far = np.hypot(20.0, 20.0)                                           # drone 1, not drone 2
    np.testing.assert_allclose(cols[3], [-20 / far, -20 / far, far / 100], atol=1e-6)
    obs = pair.step(np.zeros(12))[0]                                     # and after a step
    np.testing.assert_allclose(obs[:, -3:], cols, atol=1e-6)


def test_neighbour_slots_hear_live_drones_in_radio_range_nearest_first():
    pair = Pair(obs_report=1, obs_n_neighbours=3, r_comm=15.0)
    # drone 0 at the base; drone 1 10 north of it (connected), drone 2 10 east
    # (a tie with drone 1: the lower index first), drone 3 30 west (out of range)
    # with a report of its own; then drone 2's battery is empty
    drones = [(0, {"x": 50.0, "y": 50.0, "connected": 1}), (1, {"x": 50.0, "y": 60.0, "connected": 1}),
              (2, {"x": 60.0, "y": 50.0, "connected": 0}), (3, {"x": 20.0, "y": 50.0, "connected": 0})]
    report = {"x": 20.0, "y": 52.0, "status": 1, "owner": 3, "window": 1, "ever_confirmed": 1}
    pair.place(drones=drones, victims=[(0, report)])
    slots = pair.env.observations[:, -12:].reshape(4, 3, 4)
    np.testing.assert_allclose(slots[0], [[0, 10 / 15, 1, 0], [10 / 15, 0, 0, 0], [0, 0, 0, 0]],
                               atol=1e-6)
    np.testing.assert_allclose(slots[1, 0], [0, -10 / 15, 1, 0], atol=1e-6)   # drone 0
    np.testing.assert_allclose(slots[1, 1], [10 / 15, -10 / 15, 0, 0], atol=1e-6)  # drone 2, 14.1 away
    assert (slots[3] == 0).all()                                             # nobody in range
    assert pair.env.observations[3, -13] == pytest.approx(2 / 4)             # its own report
    # move drone 0 within range of drone 3: drone 3's report is heard
    drones[0] = (0, {"x": 32.0, "y": 50.0, "connected": 0})
    pair.place(drones=drones, victims=[(0, report)])
    slots = pair.env.observations[:, -12:].reshape(4, 3, 4)
    np.testing.assert_allclose(slots[0, 0], [-12 / 15, 0, 0, 2 / 4], atol=1e-6)
    np.testing.assert_allclose(slots[3, 0], [12 / 15, 0, 0, 0], atol=1e-6)
    # a drone whose battery is empty is not heard
    drones[2] = (2, {"x": 60.0, "y": 50.0, "connected": 0, "battery": 0.0})
    drones[0] = (0, {"x": 50.0, "y": 50.0, "connected": 1})
    pair.place(drones=drones, victims=[(0, report)])
    slots = pair.env.observations[:, -12:].reshape(4, 3, 4)
    np.testing.assert_allclose(slots[0], [[0, 10 / 15, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], atol=1e-6)
    obs = pair.step(np.zeros(12))[0]                                     # and after a step
    np.testing.assert_allclose(obs[0, -12:-8], [0, 10 / 15, 1, 0], atol=1e-6)


def test_report_is_delivered_when_its_owner_reconnects_in_time():
    drones = [(0, {"x": 50.0, "y": 66.0}), (1, {"x": 10.0, "y": 10.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    actions = np.zeros((4, 3), np.float32)
    actions[0, 1] = -1.0  # towards the base: 16 -> 13.5 from it, within r_comm
    rewards = {}
    for status in (0, 1):  # the same step without and with a pending report
        pair = Pair(m_deliver=3)
        victim = {"x": 91.0, "y": 90.0, "status": status, "owner": status - 1, "window": 3,
                  "ever_confirmed": status}
        pair.place(drones=drones, victims=[(0, victim), (1, {"x": 5.0, "y": 95.0})], step=10)
        rewards[status] = pair.step(actions)[1]
    assert pair.state["victims"]["status"][0] == 2
    assert pair.state["first_delivery_step"] == 11
    share = pair.config["r_found"] / 4  # r_found_divide_by_n: every drone gets r_found / n
    np.testing.assert_allclose(rewards[1] - rewards[0], share, atol=1e-5)


def test_owner_credit_rewards_pay_the_confirming_drone_on_delivery_and_loss():
    # drone 0 owns two reports: one it delivers this step (it flies into range
    # of the base), one whose window ends this step while drone 1, cut off, owns
    # a third report that is also lost
    drones = [(0, {"x": 50.0, "y": 66.0}), (1, {"x": 90.0, "y": 10.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    actions = np.zeros((4, 3), np.float32)
    actions[0, 1] = -1.0
    report = {"status": 1, "ever_confirmed": 1}
    rewards = {}
    for terms in ((0.0, 0.0), (2.5, -1.5)):
        pair = Pair(n_victims=3, m_deliver=3, r_deliver_owner=terms[0], r_report_lost=terms[1])
        pair.place(drones=drones, victims=[(0, {"x": 91.0, "y": 90.0, "owner": 0, "window": 3, **report}),
                                           (1, {"x": 5.0, "y": 95.0, "owner": 1, "window": 0, **report}),
                                           (2, {"x": 95.0, "y": 5.0, "owner": 1, "window": 0, **report})])
        rewards[terms] = pair.step(actions)[1]
    assert list(pair.state["victims"]["status"]) == [2, 0, 0]   # delivered, lost, lost
    np.testing.assert_allclose(rewards[(2.5, -1.5)] - rewards[(0.0, 0.0)], [2.5, -3.0, 0.0, 0.0],
                               atol=1e-5)


def test_empty_battery_drone_neither_moves_nor_scans():
    pair = Pair()
    drones = [(0, {"x": 90.0, "y": 91.0, "battery": 0.0}), (1, {"x": 10.0, "y": 10.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    pair.place(drones=drones, victims=[(0, {"x": 90.0, "y": 90.0}), (1, {"x": 5.0, "y": 95.0})])
    actions = np.ones((4, 3), np.float32)
    for _ in range(4):
        obs, *_ = pair.step(actions)
    d, v = pair.state["drones"], pair.state["victims"]
    assert (d["x"][0], d["y"][0], d["battery"][0], d["scanning"][0]) == (90.0, 91.0, 0.0, 0.0)
    assert v["progress"][0] == 0 and v["status"][0] == 0
    assert (obs[0, 10:] == 0).all()  # no detections
    assert d["scanning"][1:].tolist() == [1, 1, 1]


def test_all_batteries_empty_is_terminal():
    pair = Pair()
    pair.place(drones=[(d, {"battery": 1e-4}) for d in range(4)])
    _, _, terminals, truncations = pair.step(np.zeros(12))
    assert terminals.all() and not truncations.any()


def test_all_victims_delivered_is_terminal_and_records_statistics():
    pair = Pair()
    drones = [(0, {"x": 50.0, "y": 55.0})] + [(d, {"x": 10.0, "y": 10.0 + d}) for d in (1, 2, 3)]
    victims = [(0, {"x": 52.0, "y": 55.0, "status": 2, "ever_confirmed": 1}),
               (1, {"x": 51.0, "y": 55.0, "status": 1, "owner": 0, "window": 2, "ever_confirmed": 1})]
    pair.place(drones=drones, victims=victims, step=20, first_delivery_step=7)
    _, _, terminals, truncations = pair.step(np.zeros(12))
    assert terminals.all() and not truncations.any()
    stats = pair.env.episode_stats()
    assert stats.count == 1
    assert stats.mean["success"] == 1.0 and stats.mean["delivered"] == 2.0
    assert stats.mean["episode_length"] == 21.0 and stats.mean["time_to_first_delivery"] == 7.0


def test_truncation_keeps_the_final_observation():
    pair = Pair(max_steps=50)
    pair.place(drones=[(0, {"x": 30.0, "y": 40.0})], step=49)
    obs, _, terminals, truncations = pair.step(np.zeros(12))
    assert truncations.all() and not terminals.any()
    final = pair.env.final_observations
    np.testing.assert_allclose(final, pair.ref.final_observations, atol=TOL)
    assert final[0, 0] == pytest.approx(30.0 / 100) and final[0, 1] == pytest.approx(40.0 / 100)
    assert pair.state["step"] == 0  # the instance has reset itself
    assert not np.array_equal(obs, final)
    stats = pair.env.episode_stats()
    assert stats.count == 1 and stats.mean["episode_length"] == 50.0
    assert stats.mean["time_to_first_delivery"] == 50.0  # none: max_steps


def test_state_round_trip_and_inconsistent_states_are_refused():
    with DroneSwarm(num_envs=2, seed=3) as env:
        env.step(np.ones((env.num_agents, 3), np.float32))
        state = env.get_state(1)
        assert len(state) == env.state_layout["size"]
        env.set_state(0, state)
        np.testing.assert_array_equal(env.get_state(0), state)
        np.testing.assert_array_equal(env.observations[:8, :10], env.observations[8:, :10])
        layout = env.state_layout
        for offset, value in [(0, env.config["max_steps"]), (layout["victims"] + 2, 3),
                              (layout["victims"] + 5, 8), (layout["drones"] + 2, 1.5),
                              (layout["drones"], -1.0), (3, 0)]:
            bad = state.copy()
            bad[offset] = value
            with pytest.raises(ValueError):
                env.set_state(0, bad)


# ---- hostile input, boundaries, bad configs -----------------------------------

def test_nan_inf_and_huge_actions_act_like_their_sanitised_values():
    hostile = np.array([[np.nan, np.inf, -np.inf], [1e30, -1e30, np.nan], [3.4e38, 0.5, -0.0],
                        [-np.inf, np.nan, 1e30]] * 2, np.float32)
    clean = np.array([[0, 0, 0], [1, -1, 0], [1, 0.5, 0], [0, 0, 1]] * 2, np.float32)
    a, b = DroneSwarm(num_envs=1, seed=5), DroneSwarm(num_envs=1, seed=5)
    for _ in range(20):
        out_a = [x.copy() for x in a.step(hostile)[:4]]
        out_b = b.step(clean)[:4]
        for x, y in zip(out_a, out_b):
            np.testing.assert_array_equal(x, y)
        assert np.isfinite(out_a[0]).all() and np.isfinite(out_a[1]).all()


BOUNDARY_CONFIGS = [
    {"n_drones": 64, "n_victims": 128, "obs_n_nearest": 16, "r_sense": 1e4, "detect_prob_scale": 1e6},
    {"world_size": 1.0, "victim_min_dist": 0.0, "victim_max_dist": 1.0, "cell_size": 0.01,
     "r_comm": 0.001, "r_sense": 0.001, "min_drone_separation": 0.0, "v_max": 1e3, "dt": 100.0},
    {"world_size": 1000.0, "cell_size": 7.9, "base_x": 0.0, "base_y": 1000.0, "spawn_radius": 0.0,
     "victim_min_dist": 0.0, "victim_max_dist": 1e4, "r_confirm_radius": 1e4, "t_confirm": 1,
     "m_deliver": 0, "c_idle": 1.0, "c_move": 1.0, "c_scan": 1.0},
    {"n_drones": 1, "n_victims": 1, "obs_n_nearest": 0, "max_steps": 1, "r_found_divide_by_n": 0},
    {"randomise": 1, "r_comm_min": 0.001, "r_comm_max": 1e4, "p_comm_drop_min": 1.0,
     "p_comm_drop_max": 1.0, "t_confirm_choice_0": 1e6, "m_deliver_choice_0": 0,
     "t_confirm_choice_1": -1, "t_confirm_choice_2": -1, "m_deliver_choice_1": -1,
     "m_deliver_choice_2": -1},
    {"randomise": 1, **{f"t_confirm_choice_{i}": -1 for i in range(4)},
     **{f"m_deliver_choice_{i}": -1 for i in range(4)}},
]


@pytest.mark.parametrize("config", BOUNDARY_CONFIGS, ids=range(len(BOUNDARY_CONFIGS)))
def test_config_boundaries_run_finite(config):
    rng = np.random.default_rng(0)
    with DroneSwarm(num_envs=3, seed=1, num_threads=2, **config) as env:
        for _ in range(30):
            actions = rng.uniform(-2, 2, (env.num_agents, 3)).astype(np.float32)
            actions[rng.random(actions.shape) < 0.2] = np.nan
            obs, rewards, *_ = env.step(actions)
            assert np.isfinite(obs).all() and (np.abs(obs) <= 1).all()
            assert np.isfinite(rewards).all()
        env.episode_stats()


@pytest.mark.parametrize("config, field", [
    ({"n_drones": 0}, "n_drones"),
    ({"n_drones": 65}, "n_drones"),
    ({"n_victims": 129}, "n_victims"),
    ({"obs_n_nearest": 17}, "obs_n_nearest"),
    ({"r_sense": -1.0}, "r_sense"),
    ({"n_drones": 2.5}, "n_drones"),
    ({"base_x": 150.0}, "base_x"),
    ({"base_y": -0.5}, "base_y"),
    ({"spawn_radius": -0.5}, "spawn_radius"),
    ({"victim_min_dist": 50.0, "victim_max_dist": 40.0}, "victim_min_dist"),
    ({"world_size": 10.0}, "victim_min_dist"),  # the default annulus lies outside
    ({"cell_size": 0.5}, "cell_size"),
    ({"r_comm_min": 30.0}, "r_comm_min"),
    ({"p_comm_drop_min": 0.5}, "p_comm_drop_min"),
    ({"t_confirm_choice_2": 0}, "t_confirm_choice_2"),
    ({"max_steps": 0}, "max_steps"),
    ({"p_comm_drop": 1.5}, "p_comm_drop"),
    ({"n_obstacles": 2, "obstacle_min_size": 20.0, "obstacle_max_size": 10.0}, "obstacle_min_size"),
    ({"n_obstacles": 2, "obstacle_max_size": 95.0}, "obstacle_max_size"),  # + 2 margins > world
    ({"n_obstacles": 17}, "n_obstacles"),
    ({"obs_n_obstacles": 17}, "obs_n_obstacles"),
])
def test_invalid_configs_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        DroneSwarm(num_envs=1, seed=0, **config)
    with pytest.raises(ValueError, match=field):
        DroneSwarmReference(num_envs=1, seed=0, **config)


def test_c_refuses_cross_field_errors_on_its_own():
    """The binding validates ranges; env_init must catch what resolve_config would."""
    defaults = {name: float(default) for name, default, *_ in CONFIG_FIELDS}
    for overrides, field in [({"base_x": 150.0}, "base_x"),
                             ({"victim_min_dist": 95.0, "victim_max_dist": 90.0}, "victim_min_dist"),
                             ({"world_size": 10.0}, "victim_min_dist"),
                             ({"cell_size": 0.1}, "cell_size"),
                             ({"t_confirm_choice_0": 0.0}, "t_confirm_choice_0"),
                             ({"spawn_radius": -0.5}, "spawn_radius"),
                             ({"n_obstacles": 2.0, "obstacle_min_size": 20.0,
                               "obstacle_max_size": 10.0}, "obstacle_min_size"),
                             ({"n_obstacles": 2.0, "obstacle_max_size": 95.0}, "obstacle_max_size")]:
        values = [{**defaults, **overrides}[name] for name, *_ in CONFIG_FIELDS]
        with pytest.raises(ValueError, match=field):
            _drone_swarm.describe(values)


def test_unknown_field_and_preset_are_refused():
    with pytest.raises(ValueError, match="n_drone"):
        DroneSwarm(num_envs=1, n_drone=3)
    with pytest.raises(ValueError, match="preset"):
        DroneSwarm(num_envs=1, preset="nope")


def test_exploration_and_connected_fraction_statistics_are_sane():
    with DroneSwarm(num_envs=8, seed=2, max_steps=60) as env:
        rng = np.random.default_rng(0)
        for _ in range(60):
            env.step(policy_actions(rng, env.num_agents))
        stats = env.episode_stats()
    assert stats.count == 8
    cells = math.ceil(100 / 10) ** 2
    assert 1 / cells <= stats.mean["explored_fraction"] <= 1
    assert 0 <= stats.mean["connected_fraction"] <= 1
    assert stats.mean["episode_length"] == 60


def test_results_do_not_depend_on_the_thread_count_across_blocks():
    traces = []
    for threads in (1, 2, 3):
        with DroneSwarm(num_envs=300, seed=4, num_threads=threads, max_steps=25) as env:
            rng = np.random.default_rng(0)
            trace = []
            for _ in range(30):
                obs, rewards, terminals, _, _ = env.step(policy_actions(rng, env.num_agents))
                trace.append((obs.copy(), rewards.copy(), terminals.copy()))
            traces.append((trace, env.episode_stats().mean))
    for trace, mean in traces[1:]:
        assert mean == traces[0][1]
        for step, step_0 in zip(trace, traces[0][0]):
            for a, b in zip(step, step_0):
                np.testing.assert_array_equal(a, b)
