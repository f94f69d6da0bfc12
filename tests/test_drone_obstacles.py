"""DroneSwarm obstacles: placement, walls, line of sight, observation slots, state.

Every scenario runs the C env and the NumPy reference from the same state
(tests/test_drone_swarm.Pair) and compares them at every step; parity over
whole episodes with obstacles is in test_drone_swarm.PARITY_CONFIGS.
"""
import numpy as np
import pytest

from peregrine.envs.drone_swarm import DroneSwarm
from peregrine.envs.drone_swarm.reference import DroneSwarmReference, decode_state, encode_state

from test_drone_swarm import Pair

WALL = {"n_obstacles": 2, "obs_n_obstacles": 2, "r_sense": 30.0, "detect_prob_scale": 1e6}


def inside(rects, x, y):
    """bool [drones]: strictly inside one of rects [k, 4]."""
    x, y = np.asarray(x)[:, None], np.asarray(y)[:, None]
    return ((x > rects[:, 0]) & (x < rects[:, 2]) & (y > rects[:, 1]) & (y < rects[:, 3])).any(1)


def with_obstacles(pair, rects, **place):
    """Puts rects (x0, y0, x1, y1) into the pair's state (the other slots absent)."""
    table = np.zeros_like(pair.state["obstacles"])
    for o, rect in enumerate(rects):
        table[o] = (1.0, *rect)
    pair.state["obstacles"] = table
    pair.place(**place)


def test_placement_follows_the_config_rules():
    config = {"preset": "wilderness_obstacles_hard"}
    env = DroneSwarm(num_envs=64, seed=3, **config)
    c = env.config
    counts = []
    for _ in range(3):
        for e in range(env.num_envs):
            s = decode_state(env.get_state(e), c)
            rects = s["obstacles"][s["obstacles"][:, 0] == 1, 1:]
            counts.append(len(rects))
            w, h = rects[:, 2] - rects[:, 0], rects[:, 3] - rects[:, 1]
            tol = 1e-4
            assert ((w >= c["obstacle_min_size"] - tol) & (w <= c["obstacle_max_size"] + tol)).all()
            assert ((h >= c["obstacle_min_size"] - tol) & (h <= c["obstacle_max_size"] + tol)).all()
            margin = c["obstacle_margin"] - tol
            assert (rects[:, :2] >= margin).all() and (rects[:, 2:] <= c["world_size"] - margin).all()
            gx = np.maximum(np.maximum(rects[:, 0] - c["base_x"], c["base_x"] - rects[:, 2]), 0)
            gy = np.maximum(np.maximum(rects[:, 1] - c["base_y"], c["base_y"] - rects[:, 3]), 0)
            assert (np.hypot(gx, gy) >= c["obstacle_base_clearance"] - tol).all()
            for a in range(len(rects)):
                for b in range(a):
                    gap_x = max(rects[a, 0] - rects[b, 2], rects[b, 0] - rects[a, 2])
                    gap_y = max(rects[a, 1] - rects[b, 3], rects[b, 1] - rects[a, 3])
                    assert max(gap_x, gap_y) >= c["obstacle_separation"] - tol
            assert not inside(rects, s["drones"]["x"], s["drones"]["y"]).any()
            assert not inside(rects, s["victims"]["x"], s["victims"]["y"]).any()
        env.reset(seed=len(counts))
    assert max(counts) == c["n_obstacles"] and np.mean(counts) > 5  # nearly all placed
    env.close()


def test_no_obstacles_without_n_obstacles():
    with DroneSwarm(num_envs=2, seed=0, preset="wilderness") as env:
        assert env.obs_dim == 10 + 3 * 3
        assert env.state_layout["size"] == env.state_layout["obstacles"]


def test_a_wall_stops_a_drone_on_its_face_and_it_slides_along():
    pair = Pair(**WALL, v_max=4.0)
    drones = [(0, {"x": 38.0, "y": 30.0}), (1, {"x": 80.0, "y": 30.0}),
              (2, {"x": 10.0, "y": 10.0}), (3, {"x": 12.0, "y": 10.0})]
    with_obstacles(pair, [(40.0, 20.0, 45.0, 40.0)], drones=drones)
    actions = np.zeros((4, 3), np.float32)
    actions[0, :2] = (1.0, 0.0)     # straight into the wall
    actions[1, :2] = (-1.0, 0.0)    # from the other side, 5 steps away
    for _ in range(3):
        pair.step(actions)
    d = pair.state["drones"]
    assert d["x"][0] == 40.0 and d["y"][0] == 30.0          # stopped on the face
    assert d["x"][1] == pytest.approx(68.0)
    actions[0, :2] = (0.6, 0.8)      # diagonal: x blocked, y slides along the face
    pair.step(actions)
    assert pair.state["drones"]["x"][0] == 40.0
    assert pair.state["drones"]["y"][0] == pytest.approx(30.0 + 0.8 * 4.0)


def test_fast_drones_never_end_a_step_inside_or_tunnel_through():
    # thin walls (3 units) and v_max 9: a move longer than a wall is thick
    config = {"n_obstacles": 16, "obstacle_min_size": 3.0, "obstacle_max_size": 12.0,
              "obstacle_separation": 0.0, "v_max": 9.0, "max_steps": 60}
    env = DroneSwarm(num_envs=16, seed=5, **config)
    rng = np.random.default_rng(0)
    rects = [decode_state(env.get_state(e), env.config)["obstacles"] for e in range(16)]
    before = [decode_state(env.get_state(e), env.config)["drones"] for e in range(16)]
    stopped = 0
    for _ in range(59):
        actions = rng.uniform(-1.5, 1.5, (env.num_agents, 3)).astype(np.float32)
        env.step(actions)
        a = actions.reshape(16, -1, 3)
        for e in range(16):
            s = decode_state(env.get_state(e), env.config)
            r = rects[e][rects[e][:, 0] == 1, 1:]
            x, y = s["drones"]["x"], s["drones"]["y"]
            assert not inside(r, x, y).any()
            # the x move at the old y never crosses an interior (no tunnelling)
            x0 = before[e]["x"]
            lo, hi = np.minimum(x0, x), np.maximum(x0, x)
            y_old = before[e]["y"]
            crosses = ((lo[:, None] < r[:, 2]) & (hi[:, None] > r[:, 0]) & (y_old[:, None] > r[:, 1])
                       & (y_old[:, None] < r[:, 3]))
            assert not crosses.any()
            free = np.clip(x0 + np.clip(a[e, :, 0], -1, 1) / np.maximum(1, np.hypot(
                np.clip(a[e, :, 0], -1, 1), np.clip(a[e, :, 1], -1, 1))) * 9.0, 0, 100)
            stopped += int((np.abs(free - x) > 1e-3).sum())
            before[e] = s["drones"]
    assert stopped > 20  # the walls were hit, many times
    env.close()


def test_a_wall_between_drone_and_victim_hides_it():
    pair = Pair(**WALL)
    drones = [(0, {"x": 30.0, "y": 80.0}), (1, {"x": 10.0, "y": 10.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    victims = [(0, {"x": 50.0, "y": 80.0}), (1, {"x": 90.0, "y": 10.0})]
    scan = np.zeros((4, 3), np.float32)
    scan[0, 2] = 1.0
    # no wall: detected with certainty (detect_prob_scale huge), in slot 0
    with_obstacles(pair, [], drones=drones, victims=victims)
    obs, *_ = pair.step(scan)
    assert obs[0, 12] == 1.0 and obs[0, 10] == pytest.approx(20.0 / 100)
    # a wall across the line of sight: nothing detected, ever
    with_obstacles(pair, [(39.0, 70.0, 41.0, 90.0)], drones=drones, victims=victims)
    for _ in range(5):
        obs, *_ = pair.step(scan)
        assert (obs[0, 10:19] == 0).all()
    # the wall beside the line (touching it on a face) does not hide
    with_obstacles(pair, [(39.0, 80.0, 41.0, 90.0)], drones=drones, victims=victims)
    obs, *_ = pair.step(scan)
    assert obs[0, 12] == 1.0


def test_a_wall_blocks_confirmation_within_the_radius():
    pair = Pair(**WALL, r_confirm_radius=5.0, t_confirm=2)
    drones = [(0, {"x": 45.0, "y": 80.0}), (1, {"x": 10.0, "y": 10.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    victims = [(0, {"x": 49.0, "y": 80.0}), (1, {"x": 90.0, "y": 10.0})]
    scan = np.zeros((4, 3), np.float32)
    scan[0, 2] = 1.0
    with_obstacles(pair, [(46.0, 70.0, 47.0, 90.0)], drones=drones, victims=victims)
    for _ in range(4):
        pair.step(scan)
    assert pair.state["victims"]["status"][0] == 0 and pair.state["victims"]["progress"][0] == 0
    with_obstacles(pair, [(46.0, 81.0, 47.0, 90.0)], drones=drones, victims=victims)
    pair.step(scan)
    pair.step(scan)
    assert pair.state["victims"]["status"][0] == 1  # confirmed once the wall is out of the way


def test_obstacle_slots_hold_the_nearest_corners_relative_to_the_drone():
    pair = Pair(**WALL)
    drones = [(0, {"x": 20.0, "y": 20.0}), (1, {"x": 80.0, "y": 80.0}),
              (2, {"x": 12.0, "y": 10.0}), (3, {"x": 14.0, "y": 10.0})]
    near_first = (25.0, 15.0, 30.0, 35.0)
    far_one = (60.0, 60.0, 70.0, 70.0)
    with_obstacles(pair, [far_one, near_first], drones=drones)
    obs = pair.env.observations
    first = 10 + 3 * pair.config["obs_n_nearest"]
    expected = np.array([5.0, -5.0, 10.0, 15.0, 40.0, 40.0, 50.0, 50.0]) / 100
    np.testing.assert_allclose(obs[0, first:], expected, atol=1e-6)
    assert obs[1, first] == pytest.approx(-20.0 / 100)  # drone 1 is nearer the far one
    # a single obstacle: the second slot is empty
    with_obstacles(pair, [near_first], drones=drones)
    assert (pair.env.observations[0, first + 4:] == 0).all()


def test_inconsistent_obstacle_states_are_refused():
    env = DroneSwarm(num_envs=1, seed=0, **WALL)
    ref = DroneSwarmReference(num_envs=1, seed=0, **WALL)
    good = decode_state(env.get_state(0), env.config)
    x, y = good["drones"]["x"][0], good["drones"]["y"][0]
    bad_tables = [
        [(1, x - 1, y - 1, x + 1, y + 1), (0, 0, 0, 0, 0)],          # a drone inside
        [(1, 0, 0, 10, 10), (1, 5, 5, 15, 15)],                     # overlapping
        [(1, 10, 10, 5, 20), (0, 0, 0, 0, 0)],                      # x1 < x0
        [(2, 0, 0, 1, 1), (0, 0, 0, 0, 0)],                         # present not 0/1
        [(1, 0, 0, 1, 200), (0, 0, 0, 0, 0)],                       # outside the world
    ]
    for table in bad_tables:
        state = dict(good, obstacles=np.array(table, np.float64))
        values = encode_state(state, env.config)
        with pytest.raises(ValueError):
            env.set_state(0, values)
        with pytest.raises(ValueError):
            ref.set_state(0, values)
    env.close()


def test_renderer_draws_obstacles():
    from peregrine.envs.drone_swarm.render import COLOURS, draw_frame
    with DroneSwarm(num_envs=1, seed=0, **WALL) as env:
        state = decode_state(env.get_state(0), env.config)
        state["obstacles"][:] = [(1, 10.0, 60.0, 30.0, 70.0), (0, 70.0, 10.0, 90.0, 30.0)]
        image = draw_frame(state, env.config, size=200)
    scale = 199 / 100.0

    def colour_at(x, y):
        return image.getpixel((int(round(x * scale)), int(round(199 - y * scale))))

    assert colour_at(20, 65) == COLOURS["obstacle"]
    assert colour_at(20, 75) != COLOURS["obstacle"]     # above it
    assert colour_at(80, 20) != COLOURS["obstacle"]     # the absent slot is not drawn
