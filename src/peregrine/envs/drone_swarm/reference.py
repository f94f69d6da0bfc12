"""DroneSwarm in NumPy: the readable reference for drone_swarm.h.

Same rules (see the package docstring for every choice the spec leaves open),
same float32 operation order and the same splitmix64 draws in the same order,
so that for one seed and one action sequence it reproduces the C batch. It is
vectorized over instances; loops run over drones or draw ranks only where
the rules are sequential (exploration order, per-instance random draws).

    ref = DroneSwarmReference(num_envs=4, seed=0, n_drones=8)
    obs, _ = ref.reset(seed=0)
    obs, rewards, terminals, truncations, _ = ref.step(actions)  # float32 [4*8, 3]

decode_state/encode_state turn get_state's flat vector into named arrays and
back (the renderer and the scripted baselines read positions, batteries,
connectivity and victim status this way).
"""
from __future__ import annotations

import numpy as np

from ..native.batch import EpisodeStats
from ..reference.rng import Streams
from . import (OBSTACLE_FIELDS, STAT_NAMES, STATE_DRONE, STATE_HEADER, STATE_VICTIM, DroneSwarm,
               global_state_dim, state_layout)

f32 = np.float32
DRONE_SPAWN_TRIES = 64
VICTIM_SPAWN_TRIES = 256
OBSTACLE_TRIES = 64

DRONE_KEYS = ("x", "y", "battery", "connected", "last_comm_age", "episode_return", "scanning")
VICTIM_KEYS = ("x", "y", "status", "confirm_drone", "progress", "owner", "window", "ever_confirmed")
UNKNOWN, CONFIRMED, DELIVERED = 0, 1, 2


def _bits_to_words(bits: np.ndarray, words: int) -> np.ndarray:
    """bool [..., cells] -> float64 [..., words], 32 bits per word, bit c % 32 of word c // 32."""
    padded = np.zeros(bits.shape[:-1] + (words * 32,), dtype=np.uint64)
    padded[..., : bits.shape[-1]] = bits
    weights = np.uint64(1) << np.arange(32, dtype=np.uint64)
    return (padded.reshape(bits.shape[:-1] + (words, 32)) * weights).sum(-1).astype(np.float64)


def _words_to_bits(words: np.ndarray, cells: int) -> np.ndarray:
    w = words.astype(np.uint64)
    bits = (w[..., None] >> np.arange(32, dtype=np.uint64)) & np.uint64(1)
    return bits.reshape(w.shape[:-1] + (-1,))[..., :cells].astype(bool)


def decode_state(values, config) -> dict:
    """get_state's flat vector -> dict of named arrays (see the package docstring).

    Keys: step, r_comm, p_comm_drop, t_confirm, m_deliver, first_delivery_step,
    connected_steps; drones: {x, y, battery, connected, ...} arrays [n];
    victims: {x, y, status, ...} arrays [m]; visited: bool [cells];
    own_visited: bool [n, cells]; cells_per_side.
    """
    values = np.asarray(values, dtype=np.float64)
    lay = state_layout(config)
    n, m = int(config["n_drones"]), int(config["n_victims"])
    cells = lay["cells_per_side"] ** 2
    drones = values[lay["drones"]: lay["victims"]].reshape(n, len(DRONE_KEYS))
    victims = values[lay["victims"]: lay["visited"]].reshape(m, len(VICTIM_KEYS))
    own = values[lay["own_visited"]: lay["obstacles"]].reshape(n, lay["words"])
    obstacles = values[lay["obstacles"]: lay["size"]].reshape(-1, OBSTACLE_FIELDS)
    return {
        "step": values[0], "r_comm": values[1], "p_comm_drop": values[2],
        "t_confirm": values[3], "m_deliver": values[4], "first_delivery_step": values[5],
        "connected_steps": values[6],
        "drones": {k: drones[:, i].copy() for i, k in enumerate(DRONE_KEYS)},
        "victims": {k: victims[:, i].copy() for i, k in enumerate(VICTIM_KEYS)},
        "visited": _words_to_bits(values[lay["visited"]: lay["own_visited"]], cells),
        "own_visited": _words_to_bits(own, cells),
        "cells_per_side": lay["cells_per_side"],
        "obstacles": obstacles.copy(),
    }


def encode_state(state: dict, config) -> np.ndarray:
    """The inverse of decode_state."""
    lay = state_layout(config)
    out = np.zeros(lay["size"], dtype=np.float64)
    out[:7] = [state["step"], state["r_comm"], state["p_comm_drop"], state["t_confirm"],
               state["m_deliver"], state["first_delivery_step"], state["connected_steps"]]
    out[lay["drones"]: lay["victims"]] = np.stack(
        [np.asarray(state["drones"][k], np.float64) for k in DRONE_KEYS], axis=1).ravel()
    out[lay["victims"]: lay["visited"]] = np.stack(
        [np.asarray(state["victims"][k], np.float64) for k in VICTIM_KEYS], axis=1).ravel()
    out[lay["visited"]: lay["own_visited"]] = _bits_to_words(np.asarray(state["visited"]), lay["words"])
    out[lay["own_visited"]: lay["obstacles"]] = _bits_to_words(np.asarray(state["own_visited"]),
                                                               lay["words"]).ravel()
    out[lay["obstacles"]:] = np.asarray(state.get("obstacles", np.zeros((0, OBSTACLE_FIELDS))),
                                        np.float64).ravel()
    return out


class DroneSwarmReference:
    """A batch of DroneSwarm instances with NativeEnv's reset/step contract."""

    def __init__(self, num_envs: int = 1, seed: int = 0, preset: str = "default", **config):
        self.config = c = DroneSwarm.resolve_config(DroneSwarm.config_with_preset(preset, config))
        self.num_envs = E = int(num_envs)
        self.n = n = int(c["n_drones"])
        self.m = m = int(c["n_victims"])
        self.k = int(c["obs_n_nearest"])
        self.n_obstacles = int(c["n_obstacles"])
        self.k_obstacles = int(c["obs_n_obstacles"])
        self.num_agents = E * n
        self.agents_per_env = n
        self.report = int(c["obs_report"])
        self.network = int(c["obs_network"])
        self.drone_id = int(c["obs_drone_id"])
        self.k_neighbours = int(c["obs_n_neighbours"])
        self.obs_dim = (10 + 3 * self.k + 4 * self.k_obstacles + self.report + 3 * self.network
                        + self.drone_id + 4 * self.k_neighbours)
        self.layout = state_layout(c)
        self.side = self.layout["cells_per_side"]
        self.cells = self.side * self.side
        for name in ("world_size", "base_x", "base_y", "r_comm", "r_sense", "r_confirm_radius",
                     "v_max", "dt", "c_idle", "c_move", "c_scan", "spawn_radius",
                     "victim_min_dist", "victim_max_dist", "detect_prob_scale", "cell_size",
                     "r_time", "c_energy", "r_found", "r_confirm", "r_explore", "r_scan_near",
                     "r_dispersion", "min_drone_separation", "r_connect", "p_comm_drop",
                     "r_deliver_owner", "r_report_lost",
                     "r_comm_min", "r_comm_max", "p_comm_drop_min", "p_comm_drop_max",
                     "obstacle_min_size", "obstacle_max_size", "obstacle_margin",
                     "obstacle_base_clearance", "obstacle_separation"):
            setattr(self, name, f32(c[name]))
        self.max_steps = int(c["max_steps"])
        self.t_choices = [int(c[f"t_confirm_choice_{i}"]) for i in range(4)
                          if c[f"t_confirm_choice_{i}"] != -1]
        self.m_choices = [int(c[f"m_deliver_choice_{i}"]) for i in range(4)
                          if c[f"m_deliver_choice_{i}"] != -1]

        # episode parameters and counters, per instance
        self.step_count = np.zeros(E, np.int64)
        self.ep_r_comm = np.zeros(E, np.float32)
        self.ep_p_drop = np.zeros(E, np.float32)
        self.ep_t_confirm = np.zeros(E, np.int64)
        self.ep_m_deliver = np.zeros(E, np.int64)
        self.first_delivery = np.full(E, -1, np.int64)
        self.connected_steps = np.zeros(E, np.int64)
        # drones [E, n]
        self.x = np.zeros((E, n), np.float32)
        self.y = np.zeros((E, n), np.float32)
        self.battery = np.zeros((E, n), np.float32)
        self.connected = np.zeros((E, n), bool)
        self.age = np.zeros((E, n), np.int64)
        self.returns = np.zeros((E, n), np.float32)
        self.scanning = np.zeros((E, n), bool)
        # victims [E, m]
        self.vx = np.zeros((E, m), np.float32)
        self.vy = np.zeros((E, m), np.float32)
        self.status = np.zeros((E, m), np.int64)
        self.confirm_drone = np.full((E, m), -1, np.int64)
        self.progress = np.zeros((E, m), np.int64)
        self.owner = np.full((E, m), -1, np.int64)
        self.window = np.zeros((E, m), np.int64)
        self.ever_confirmed = np.zeros((E, m), bool)
        # obstacles [E, n_obstacles, 4] = (x0, y0, x1, y1), the placed ones first
        self.obstacles = np.zeros((E, self.n_obstacles, 4), np.float32)
        self.obstacle_count = np.zeros(E, np.int64)
        # exploration
        self.visited = np.zeros((E, self.cells), bool)
        self.own_visited = np.zeros((E, n, self.cells), bool)

        self.observations = np.zeros((E * n, self.obs_dim), np.float32)
        self.final_observations = np.zeros((E * n, self.obs_dim), np.float32)
        # the global state (package docstring), always kept here
        self.state_dim = global_state_dim(c)
        self.states = np.zeros((E, self.state_dim), np.float32)
        self.final_states = np.zeros((E, self.state_dim), np.float32)
        self.episodes: list[tuple[float, ...]] = []  # one row of STAT_NAMES per finished episode
        self.streams = Streams(seed, E)
        self.reset(seed)

    # ---- random draws in a fixed order ----------------------------------------
    def _draws_for(self, candidates: np.ndarray) -> np.ndarray:
        """One uniform per True entry of candidates [E, K], drawn per instance in
        column order (the C loop order); float32 [E, K], 0 where not a candidate."""
        counts = candidates.sum(axis=1)
        most = int(counts.max()) if counts.size else 0
        out = np.zeros(candidates.shape, np.float32)
        if most == 0:
            return out
        draws = np.zeros((candidates.shape[0], most), np.float32)
        for rank in range(most):
            idx = np.flatnonzero(counts > rank)
            draws[idx, rank] = self.streams.uniform(idx)
        rank = np.clip(np.cumsum(candidates, axis=1) - 1, 0, most - 1)
        out = np.take_along_axis(draws, rank, axis=1)
        return np.where(candidates, out, f32(0))

    def _uniform_between(self, idx, low, high):
        u = self.streams.uniform(idx)
        return low + u * (high - low)

    # ---- reset -------------------------------------------------------------
    def reset(self, seed=None):
        if seed is not None:
            self.streams = Streams(seed, self.num_envs)
        self._reset_instances(np.arange(self.num_envs))
        return self.observations, {}

    def _reset_instances(self, idx: np.ndarray):
        if idx.size == 0:
            return
        if self.config["randomise"]:
            self.ep_r_comm[idx] = self._uniform_between(idx, self.r_comm_min, self.r_comm_max)
            self.ep_p_drop[idx] = self._uniform_between(idx, self.p_comm_drop_min, self.p_comm_drop_max)
            if self.t_choices:
                pick = self.streams.randint(idx, len(self.t_choices))
                self.ep_t_confirm[idx] = np.asarray(self.t_choices)[pick]
            else:
                self.ep_t_confirm[idx] = int(self.config["t_confirm"])
            if self.m_choices:
                pick = self.streams.randint(idx, len(self.m_choices))
                self.ep_m_deliver[idx] = np.asarray(self.m_choices)[pick]
            else:
                self.ep_m_deliver[idx] = int(self.config["m_deliver"])
        else:
            self.ep_r_comm[idx] = self.r_comm
            self.ep_p_drop[idx] = self.p_comm_drop
            self.ep_t_confirm[idx] = int(self.config["t_confirm"])
            self.ep_m_deliver[idx] = int(self.config["m_deliver"])

        bx, by, size = self.base_x, self.base_y, self.world_size
        if self.n_obstacles:
            for e in idx:
                self._place_obstacles(int(e))
        outside = self._outside_obstacles
        # drones: uniform in the disc around the base (outside obstacles), clipped to the world
        radius = self.ep_r_comm[idx] if self.spawn_radius < 0 else np.full(idx.size, self.spawn_radius, np.float32)
        lo_x, hi_x = np.maximum(bx - radius, f32(0)), np.minimum(bx + radius, size)
        lo_y, hi_y = np.maximum(by - radius, f32(0)), np.minimum(by + radius, size)
        radius2 = radius * radius
        for d in range(self.n):
            x, y, ok = self._rejection(idx, lo_x, hi_x, lo_y, hi_y,
                                       lambda d2, sel, px, py: (d2 <= radius2[sel])
                                       & outside(idx[sel], px, py), DRONE_SPAWN_TRIES)
            self.x[idx, d] = np.where(ok, x, bx)
            self.y[idx, d] = np.where(ok, y, by)
        # victims: uniform in the annulus inside the world
        vmin, vmax = self.victim_min_dist, self.victim_max_dist
        vmin2, vmax2 = vmin * vmin, vmax * vmax
        lo_x, hi_x = np.maximum(bx - vmax, f32(0)), np.minimum(bx + vmax, size)
        lo_y, hi_y = np.maximum(by - vmax, f32(0)), np.minimum(by + vmax, size)
        ones = np.ones(idx.size, np.float32)
        for v in range(self.m):
            x, y, _ = self._rejection(idx, lo_x * ones, hi_x * ones, lo_y * ones, hi_y * ones,
                                      lambda d2, sel, px, py: (d2 >= vmin2) & (d2 <= vmax2)
                                      & outside(idx[sel], px, py), VICTIM_SPAWN_TRIES)
            self.vx[idx, v] = x
            self.vy[idx, v] = y

        self.battery[idx] = 1.0
        self.age[idx] = 0
        self.returns[idx] = 0.0
        self.scanning[idx] = False
        self.step_count[idx] = 0
        self.first_delivery[idx] = -1
        self.connected_steps[idx] = 0
        self.status[idx] = UNKNOWN
        self.confirm_drone[idx] = -1
        self.progress[idx] = 0
        self.owner[idx] = -1
        self.window[idx] = 0
        self.ever_confirmed[idx] = False
        self.visited[idx] = False
        self.own_visited[idx] = False
        cell = self._cells(idx)
        for d in range(self.n):
            self.visited[idx, cell[:, d]] = True
            self.own_visited[idx, d, cell[:, d]] = True
        alive = self.battery[idx] > 0
        base_link, links, _ = self._links(idx, alive)
        self.connected[idx] = self._closure(base_link, links)
        self._observe(idx, None)

    def _rejection(self, idx, lo_x, hi_x, lo_y, hi_y, accept, tries):
        """Per instance: draw (x, y) in the box until accept(d2 from base) or tries run out."""
        x = np.zeros(idx.size, np.float32)
        y = np.zeros(idx.size, np.float32)
        ok = np.zeros(idx.size, bool)
        pending = np.arange(idx.size)
        for _ in range(tries):
            if pending.size == 0:
                break
            inst = idx[pending]
            px = self._uniform_between(inst, lo_x[pending], hi_x[pending])
            py = self._uniform_between(inst, lo_y[pending], hi_y[pending])
            dx, dy = px - self.base_x, py - self.base_y
            good = accept(dx * dx + dy * dy, pending, px, py)
            x[pending], y[pending] = px, py
            ok[pending] = good
            pending = pending[~good]
        return x, y, ok

    # ---- obstacles (see ds_place_obstacles & co. in drone_swarm.h) ----------------
    def _place_obstacles(self, e: int) -> None:
        one = np.array([e])
        lo, hi = self.obstacle_min_size, self.obstacle_max_size
        margin, size, sep = self.obstacle_margin, self.world_size, self.obstacle_separation
        clear2 = self.obstacle_base_clearance * self.obstacle_base_clearance
        placed = []
        for _ in range(self.n_obstacles):
            for _ in range(OBSTACLE_TRIES):
                w = self._uniform_between(one, lo, hi)[0]
                h = self._uniform_between(one, lo, hi)[0]
                x0 = self._uniform_between(one, margin, size - margin - w)[0]
                y0 = self._uniform_between(one, margin, size - margin - h)[0]
                rect = np.array([x0, y0, min(x0 + w, size), min(y0 + h, size)], np.float32)
                ok = _rect_d2(rect, self.base_x, self.base_y) >= clear2
                for other in placed:
                    if not ok:
                        break
                    gap_x = max(other[0] - rect[2], rect[0] - other[2])
                    gap_y = max(other[1] - rect[3], rect[1] - other[3])
                    ok = gap_x >= sep or gap_y >= sep
                if ok:
                    placed.append(rect)
                    break
        self.obstacles[e] = 0.0
        if placed:
            self.obstacles[e, :len(placed)] = np.stack(placed)
        self.obstacle_count[e] = len(placed)

    def _outside_obstacles(self, inst, px, py) -> np.ndarray:
        """bool [len(inst)]: (px, py) is not strictly inside an obstacle of its instance."""
        inside = np.zeros(len(inst), bool)
        for o in range(self.n_obstacles):
            r = self.obstacles[inst, o]
            inside |= ((o < self.obstacle_count[inst]) & (px > r[:, 0]) & (px < r[:, 2])
                       & (py > r[:, 1]) & (py < r[:, 3]))
        return ~inside

    def _stop_at_faces(self, axis: int, start, to, across):
        """Movement along one axis (arrays [E, n]): stops on the first face in the way."""
        for o in range(self.n_obstacles):
            r = self.obstacles[:, o][:, None, :]
            lo, hi, a_lo, a_hi = r[..., axis], r[..., axis + 2], r[..., 1 - axis], r[..., 3 - axis]
            live = (o < self.obstacle_count)[:, None] & (across > a_lo) & (across < a_hi)
            to = np.where(live & (to > start) & (start <= lo) & (to > lo), lo, to)
            to = np.where(live & (to < start) & (start >= hi) & (to < hi), hi, to)
        return to

    def _hidden(self):
        """bool [E, n, m]: an obstacle interior crosses the segment drone -> victim."""
        ax, ay = self.x[:, :, None], self.y[:, :, None]
        dx, dy = self.vx[:, None, :] - ax, self.vy[:, None, :] - ay
        hidden = np.zeros(dx.shape, bool)
        inf = f32(np.inf)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            for o in range(self.n_obstacles):
                r = self.obstacles[:, o][:, None, None, :]
                x0, y0, x1, y1 = r[..., 0], r[..., 1], r[..., 2], r[..., 3]
                sx = np.where(dx != 0, dx, f32(1))
                t1, t2 = (x0 - ax) / sx, (x1 - ax) / sx
                lo = np.where(dx != 0, np.minimum(t1, t2), -inf)
                hi = np.where(dx != 0, np.maximum(t1, t2), inf)
                ok = (dx != 0) | ((ax > x0) & (ax < x1))
                sy = np.where(dy != 0, dy, f32(1))
                t1, t2 = (y0 - ay) / sy, (y1 - ay) / sy
                lo = np.where(dy != 0, np.maximum(lo, np.minimum(t1, t2)), lo)
                hi = np.where(dy != 0, np.minimum(hi, np.maximum(t1, t2)), hi)
                ok &= (dy != 0) | ((ay > y0) & (ay < y1))
                live = (o < self.obstacle_count)[:, None, None]
                hidden |= live & ok & (lo < hi) & (lo < 1) & (hi > 0)
        return hidden

    def _obstacle_slots(self, idx):
        """float32 [E', n, 4 * k_obstacles]: the nearest obstacles' corners relative to each drone."""
        kq, size = self.k_obstacles, self.world_size
        if self.n_obstacles == 0:
            return np.zeros((idx.size, self.n, 4 * kq), np.float32)
        x, y = self.x[idx][:, :, None], self.y[idx][:, :, None]
        r = self.obstacles[idx][:, None, :, :]                       # [E', 1, O, 4]
        gx = np.maximum(np.maximum(r[..., 0] - x, x - r[..., 2]), f32(0))
        gy = np.maximum(np.maximum(r[..., 1] - y, y - r[..., 3]), f32(0))
        d2 = gx * gx + gy * gy
        placed = np.arange(self.n_obstacles)[None, None, :] < self.obstacle_count[idx][:, None, None]
        corners = [np.clip((r[..., f] - coordinate) / size, f32(-1), f32(1))
                   for f, coordinate in enumerate((x, y, x, y))]
        return self._nearest_slots(d2, placed, kq, corners)

    @staticmethod
    def _nearest_slots(d2, valid, k, fields):
        """float32 [E', n, len(fields) * k]: per drone its k nearest valid candidates
        (d2 [E', n, C] over the last axis, ties to the lower index), each slot the
        fields' values there (arrays broadcastable to d2), zero past the valid ones."""
        order = np.argsort(np.where(valid, d2, f32(np.inf)), axis=2, kind="stable")[:, :, :k]
        found = np.take_along_axis(valid, order, axis=2)
        width = len(fields)
        out = np.zeros((*d2.shape[:2], width * k), np.float32)
        for f, value in enumerate(fields):
            taken = np.take_along_axis(np.broadcast_to(value, d2.shape), order, axis=2)
            out[:, :, f:width * order.shape[2]:width] = np.where(found, taken, f32(0))
        return out

    # ---- pieces of a step ---------------------------------------------------
    def _report_column(self, idx):
        """float32 [E', n]: 0, or (window + 1) / (m_deliver + 1) of the drone's most
        urgent confirmed, undelivered report."""
        scale = f32(1) / (self.ep_m_deliver[idx] + 1).astype(np.float32)
        left = (self.window[idx] + 1).astype(np.float32) * scale[:, None]      # [E', m]
        held = (self.status[idx] == CONFIRMED)[:, None, :] & \
            (self.owner[idx][:, None, :] == np.arange(self.n)[None, :, None])   # [E', n, m]
        urgent = np.where(held, left[:, None, :], f32(2)).min(axis=2)
        return np.where(held.any(axis=2), urgent, f32(0)).astype(np.float32)

    def _network_columns(self, idx):
        """float32 [E', n, 3]: unit vector and distance / L to the nearest of the base
        and the other connected drones (ties: the base, then the lower index)."""
        n = self.n
        x, y = self.x[idx], self.y[idx]                                   # [E', n]
        # candidates: the base (column 0), then drones 0..n-1
        cx = np.concatenate([np.full((idx.size, 1), self.base_x, np.float32), x], axis=1)
        cy = np.concatenate([np.full((idx.size, 1), self.base_y, np.float32), y], axis=1)
        dx = cx[:, None, :] - x[:, :, None]                               # [E', n, 1 + n]
        dy = cy[:, None, :] - y[:, :, None]
        d2 = dx * dx + dy * dy
        usable = np.ones(d2.shape, bool)
        usable[:, :, 1:] = self.connected[idx][:, None, :] & ~np.eye(n, dtype=bool)[None]
        best = np.where(usable, d2, f32(np.inf)).argmin(axis=2)[..., None]   # first minimum
        dx = np.take_along_axis(dx, best, 2)[..., 0]
        dy = np.take_along_axis(dy, best, 2)[..., 0]
        dist = np.sqrt(np.take_along_axis(d2, best, 2)[..., 0])
        safe = dist + np.where(dist > 0, f32(0), f32(1))
        return np.stack([dx / safe, dy / safe, dist / self.world_size], axis=2)

    def _cells(self, idx):
        side = self.side
        cx = np.minimum((self.x[idx] / self.cell_size).astype(np.int64), side - 1)
        cy = np.minimum((self.y[idx] / self.cell_size).astype(np.int64), side - 1)
        return cy * side + cx

    def _pair_d2(self, idx):
        dx = self.x[idx][:, :, None] - self.x[idx][:, None, :]
        dy = self.y[idx][:, :, None] - self.y[idx][:, None, :]
        return dx * dx + dy * dy

    def _links(self, idx, alive):
        """Base links [E', n], drone links [E', n, n] (alive, within r_comm), pair d2."""
        r2 = self.ep_r_comm[idx] * self.ep_r_comm[idx]
        dxb = self.x[idx] - self.base_x
        dyb = self.y[idx] - self.base_y
        base_link = alive & (dxb * dxb + dyb * dyb <= r2[:, None])
        d2 = self._pair_d2(idx)
        both = alive[:, :, None] & alive[:, None, :] & ~np.eye(self.n, dtype=bool)
        links = both & (d2 <= r2[:, None, None])
        return base_link, links, d2

    @staticmethod
    def _closure(base_link, links):
        connected = base_link.copy()
        while True:
            grown = connected | (links & connected[:, :, None]).any(axis=1)
            if (grown == connected).all():
                return connected
            connected = grown

    def _neighbour_features(self, idx, d2, alive):
        """Live neighbours within r_comm and nearest live neighbour distance (inf if none)."""
        others = alive[:, None, :] & ~np.eye(self.n, dtype=bool)
        r2 = self.ep_r_comm[idx] * self.ep_r_comm[idx]
        count = (others & (d2 <= r2[:, None, None])).sum(axis=2)
        nearest2 = np.where(others, d2, f32(np.inf)).min(axis=2)
        return count, np.sqrt(nearest2)

    def _neighbour_slots(self, idx):
        """float32 [E', n, 4 * obs_n_neighbours]: per live drone within the episode's
        r_comm, nearest first (ties: lower index), its (dx, dy) / r_comm, connected
        flag and report (as the obs_report column); zero past the drones in range."""
        x, y = self.x[idx], self.y[idx]
        dx = x[:, None, :] - x[:, :, None]                                # [E', d, e]: e - d
        dy = y[:, None, :] - y[:, :, None]
        d2 = dx * dx + dy * dy
        r = self.ep_r_comm[idx]
        heard = ((self.battery[idx] > 0)[:, None, :] & ~np.eye(self.n, dtype=bool)[None]
                 & (d2 <= (r * r)[:, None, None]))
        inv_r = (f32(1) / r)[:, None, None]
        fields = [np.clip(dx * inv_r, f32(-1), f32(1)), np.clip(dy * inv_r, f32(-1), f32(1)),
                  self.connected[idx].astype(np.float32)[:, None, :],
                  self._report_column(idx)[:, None, :]]
        return self._nearest_slots(d2, heard, self.k_neighbours, fields)

    def _observe(self, idx, detections):
        """Writes the observation rows of instances idx. detections: None or
        (slot_dx, slot_dy, slot_p) float32 [E', n, k] already zero where empty."""
        n, size = self.n, self.world_size
        alive = self.battery[idx] > 0
        count, nearest = self._neighbour_features(idx, self._pair_d2(idx), alive)
        x, y = self.x[idx], self.y[idx]
        dbx, dby = self.base_x - x, self.base_y - y
        dist = np.sqrt(dbx * dbx + dby * dby)
        r_comm = self.ep_r_comm[idx][:, None]
        safe = dist + np.where(dist > 0, f32(0), f32(1))  # dist, or 1 at the base (then 0 / 1)
        ux, uy = dbx / safe, dby / safe
        with np.errstate(divide="ignore", invalid="ignore"):
            near_feature = nearest / r_comm
        near_feature = np.where(near_feature < 1, near_feature, f32(1))
        neighbours = count.astype(np.float32) / f32(n - 1) if n > 1 else np.zeros_like(x)
        features = [x / size, y / size, self.battery[idx], dist / size,
                    self.connected[idx].astype(np.float32),
                    self.age[idx].astype(np.float32) / f32(self.max_steps),
                    neighbours, near_feature, ux, uy]
        obs = np.zeros((idx.size, n, self.obs_dim), np.float32)
        obs[:, :, :10] = np.stack(features, axis=2)
        if detections is not None and self.k:
            sx, sy, sp = detections
            end = 10 + 3 * self.k
            obs[:, :, 10:end:3], obs[:, :, 11:end:3], obs[:, :, 12:end:3] = sx, sy, sp
        if self.k_obstacles:
            first = 10 + 3 * self.k
            obs[:, :, first:first + 4 * self.k_obstacles] = self._obstacle_slots(idx)
        tail = self.obs_dim - self.report - 3 * self.network - self.drone_id - 4 * self.k_neighbours
        if self.report:
            obs[:, :, tail] = self._report_column(idx)
            tail += 1
        if self.network:
            obs[:, :, tail:tail + 3] = self._network_columns(idx)
            tail += 3
        if self.drone_id:
            scale = f32(1) / f32(n - 1) if n > 1 else f32(0)
            obs[:, :, tail] = np.arange(n, dtype=np.float32) * scale
            tail += 1
        if self.k_neighbours:
            obs[:, :, tail:] = self._neighbour_slots(idx)
        obs = np.clip(obs, f32(-1), f32(1))
        rows = (idx[:, None] * n + np.arange(n)).ravel()
        self.observations[rows] = obs.reshape(-1, self.obs_dim)
        self.states[idx] = self._global_states(idx)

    def _global_states(self, idx):
        """float32 [E', state_dim]: the global state of instances idx (package docstring)."""
        n, m, size, steps = self.n, self.m, self.world_size, f32(self.max_steps)
        out = np.zeros((idx.size, self.state_dim), np.float32)
        out[:, 0] = self.step_count[idx].astype(np.float32) / steps
        out[:, 1] = self.ep_r_comm[idx] / size
        out[:, 2] = self.ep_p_drop[idx]
        out[:, 3] = self.visited[idx].sum(axis=1).astype(np.float32) / f32(self.cells)
        drones = np.stack([self.x[idx] / size, self.y[idx] / size, self.battery[idx],
                           self.connected[idx].astype(np.float32),
                           self.age[idx].astype(np.float32) / steps,
                           self.scanning[idx].astype(np.float32), self._report_column(idx)],
                          axis=2)
        status = self.status[idx]
        scale = f32(1) / (self.ep_m_deliver[idx] + 1).astype(np.float32)
        left = (self.window[idx] + 1).astype(np.float32) * scale[:, None]
        progress = self.progress[idx].astype(np.float32) / \
            self.ep_t_confirm[idx].astype(np.float32)[:, None]
        victims = np.stack([self.vx[idx] / size, self.vy[idx] / size,
                            (status == CONFIRMED).astype(np.float32),
                            (status == DELIVERED).astype(np.float32),
                            np.where(status == CONFIRMED, left, f32(0)), progress], axis=2)
        present = np.arange(self.n_obstacles)[None, :] < self.obstacle_count[idx][:, None]
        obstacles = np.concatenate([present[..., None].astype(np.float32),
                                    np.where(present[..., None], self.obstacles[idx] / size,
                                             f32(0))], axis=2)
        first = STATE_HEADER + STATE_DRONE * n
        out[:, STATE_HEADER:first] = drones.reshape(idx.size, -1)
        out[:, first:first + STATE_VICTIM * m] = victims.reshape(idx.size, -1)
        out[:, first + STATE_VICTIM * m:] = obstacles.reshape(idx.size, -1)
        return np.clip(out, f32(-1), f32(1))

    # ---- the step -------------------------------------------------------------
    def step(self, actions):
        E, n, m = self.num_envs, self.n, self.m
        every = np.arange(E)
        a = np.asarray(actions, dtype=np.float32).reshape(E, n, 3)
        a = np.clip(np.where(np.isfinite(a), a, f32(0)), f32(-1), f32(1))
        vx, vy, scan = a[..., 0], a[..., 1], a[..., 2]

        # 1. movement (active drones: battery > 0 at the start of the step)
        active = self.battery > 0
        norm2 = vx * vx + vy * vy
        big = np.where(norm2 > 1, f32(1), f32(0))
        norm = np.sqrt(norm2) * big + (f32(1) - big)  # |v| when > 1, else exactly 1
        vx = np.where(active, vx, f32(0)) / norm
        vy = np.where(active, vy, f32(0)) / norm
        scanning = active & (scan > 0)
        speed2 = vx * vx + vy * vy
        old_x, old_y = self.x, self.y
        self.x = np.clip(self.x + (vx * self.v_max) * self.dt, f32(0), self.world_size)
        self.y = np.clip(self.y + (vy * self.v_max) * self.dt, f32(0), self.world_size)
        if self.n_obstacles:  # x first at the old y, then y at the new x
            self.x = self._stop_at_faces(0, old_x, self.x, old_y)
            self.y = self._stop_at_faces(1, old_y, self.y, self.x)
        self.scanning = scanning
        # exploration, drone by drone (the lower index takes a cell first)
        cell = self._cells(every)
        explore = np.zeros((E, n), np.float32)
        for d in range(n):
            c, act = cell[:, d], active[:, d]
            new_global = act & ~self.visited[every, c]
            new_own = act & ~self.own_visited[every, d, c]
            explore[:, d] = np.where(new_global, f32(1), f32(0)) + np.where(new_own, f32(0.5), f32(0))
            self.visited[every, c] |= act
            self.own_visited[every, d, c] |= act

        # 2. battery
        drain = (self.c_idle + self.c_move * speed2 + self.c_scan * scanning.astype(np.float32)) * self.dt
        battery = self.battery - drain
        self.battery = np.where(battery > 0, battery, f32(0))
        alive = self.battery > 0

        # 3. connectivity, with link drops drawn in a fixed order
        base_link, links, d2 = self._links(every, alive)
        p = self.ep_p_drop
        if (p > 0).any():
            upper = np.triu_indices(n, 1)
            candidates = np.concatenate([base_link, links[:, upper[0], upper[1]]], axis=1)
            candidates &= (p > 0)[:, None]
            keep = ~candidates | (self._draws_for(candidates) >= p[:, None])
            base_link = base_link & keep[:, :n]
            kept_pairs = links[:, upper[0], upper[1]] & keep[:, n:]
            links = np.zeros_like(links)
            links[:, upper[0], upper[1]] = kept_pairs
            links[:, upper[1], upper[0]] = kept_pairs
        self.connected = self._closure(base_link, links)
        self.age = np.where(self.connected, 0, self.age + 1)
        self.connected_steps += self.connected.sum(axis=1)

        # 4. confirmation
        dvx = self.vx[:, None, :] - self.x[:, :, None]  # [E, n, m] victim minus drone
        dvy = self.vy[:, None, :] - self.y[:, :, None]
        vd2 = dvx * dvx + dvy * dvy
        if self.n_obstacles:  # line of sight: a hidden victim is out of every range
            vd2 = np.where(self._hidden(), f32(np.inf), vd2)
        rc2 = self.r_confirm_radius * self.r_confirm_radius
        within = scanning[:, :, None] & (vd2 <= rc2)
        has = within.any(axis=1)
        nearest = np.where(within, vd2, f32(np.inf)).argmin(axis=1)
        unknown = self.status == UNKNOWN
        same = has & (nearest == self.confirm_drone)
        self.progress = np.where(unknown, np.where(has, np.where(same, self.progress + 1, 1), 0),
                                 self.progress)
        self.confirm_drone = np.where(unknown, np.where(has, nearest, -1), self.confirm_drone)
        newly = unknown & has & (self.progress >= self.ep_t_confirm[:, None])
        self.status[newly] = CONFIRMED
        self.owner = np.where(newly, nearest, self.owner)
        self.window = np.where(newly, self.ep_m_deliver[:, None], self.window)
        self.ever_confirmed |= newly
        self.progress[newly] = 0
        self.confirm_drone[newly] = -1
        confirmations = (newly[:, None, :] & (nearest[:, None, :] == np.arange(n)[None, :, None])).sum(axis=2)

        # 5. delivery
        confirmed = self.status == CONFIRMED
        owner_connected = np.take_along_axis(self.connected, np.maximum(self.owner, 0), axis=1)
        deliver = confirmed & owner_connected
        waiting = confirmed & ~owner_connected
        lose = waiting & (self.window == 0)
        # per drone: its own reports delivered / lost this step (owner-credit rewards)
        drones = np.arange(n)[None, :, None]
        own_delivered = ((self.owner[:, None, :] == drones) & deliver[:, None, :]).sum(axis=2)
        own_lost = ((self.owner[:, None, :] == drones) & lose[:, None, :]).sum(axis=2)
        self.status[deliver] = DELIVERED
        self.window = np.where(waiting & ~lose, self.window - 1, self.window)
        self.status[lose] = UNKNOWN
        self.owner[lose] = -1
        delivered_now = deliver.sum(axis=1)
        self.first_delivery = np.where((self.first_delivery < 0) & (delivered_now > 0),
                                       self.step_count + 1, self.first_delivery)

        # 6. detections, drawn in (drone, victim) order for candidates only
        rs2 = self.r_sense * self.r_sense
        candidates = scanning[:, :, None] & (self.status != DELIVERED)[:, None, :] & (vd2 <= rs2)
        u = self._draws_for(candidates.reshape(E, n * m)).reshape(E, n, m)
        prob = (f32(1) - np.sqrt(vd2) / self.r_sense) * self.detect_prob_scale
        prob = np.clip(prob, f32(0), f32(1))
        detected = candidates & (u < prob)
        detections = None
        if self.k:
            key = np.where(detected, vd2, f32(np.inf))
            order = np.argsort(key, axis=2, kind="stable")[:, :, : self.k]
            k_eff = order.shape[2]
            found = np.take_along_axis(detected, order, axis=2)
            size = self.world_size
            sx = np.zeros((E, n, self.k), np.float32)
            sy = np.zeros((E, n, self.k), np.float32)
            sp = np.zeros((E, n, self.k), np.float32)
            sx[:, :, :k_eff] = np.where(found, np.take_along_axis(dvx, order, axis=2) / size, f32(0))
            sy[:, :, :k_eff] = np.where(found, np.take_along_axis(dvy, order, axis=2) / size, f32(0))
            sp[:, :, :k_eff] = np.where(found, np.take_along_axis(prob, order, axis=2), f32(0))
            detections = (sx, sy, sp)

        # 7. rewards, observations, statistics
        near_radius = f32(2) * self.r_confirm_radius
        scan_near = scanning & ((self.status == UNKNOWN)[:, None, :] & (vd2 <= near_radius * near_radius)).any(axis=2)
        _, nearest_dist = self._neighbour_features(every, d2, alive)
        with np.errstate(divide="ignore", invalid="ignore"):
            penalty = self.r_dispersion * (f32(1) - nearest_dist / self.min_drone_separation)
        dispersion = np.where(nearest_dist >= self.min_drone_separation, self.r_dispersion, -penalty)
        dispersion = np.where(alive, dispersion, f32(0))
        share = self.r_found * delivered_now.astype(np.float32)
        if self.config["r_found_divide_by_n"]:
            share = share / f32(n)
        r = np.full((E, n), self.r_time, np.float32)
        r = r - self.c_energy * speed2
        share = share[:, None] + self.r_deliver_owner * own_delivered.astype(np.float32)
        r = r + (share + self.r_report_lost * own_lost.astype(np.float32))
        r = r + self.r_confirm * confirmations.astype(np.float32)
        r = r + self.r_explore * explore
        r = r + np.where(scan_near, self.r_scan_near, f32(0))
        r = r + dispersion
        r = r + np.where(self.connected, self.r_connect, f32(0))
        self.returns = self.returns + r
        self.step_count += 1
        self._observe(every, detections)

        # 8. end of episode
        terminal = (self.status == DELIVERED).all(axis=1) | ~alive.any(axis=1)
        truncated = ~terminal & (self.step_count >= self.max_steps)
        done = np.flatnonzero(terminal | truncated)
        if done.size:
            rows = (done[:, None] * n + np.arange(n)).ravel()
            self.final_observations[rows] = self.observations[rows]
            self.final_states[done] = self.states[done]
            for e in done:
                self.episodes.append(self._episode_stats(e))
            self._reset_instances(done)
        rewards = r.reshape(-1)
        return (self.observations, rewards, np.repeat(terminal, n), np.repeat(truncated, n), {})

    def _episode_stats(self, e) -> tuple[float, ...]:
        n, length = self.n, int(self.step_count[e])
        delivered = int((self.status[e] == DELIVERED).sum())
        first = int(self.first_delivery[e])
        total = 0.0
        for d in range(n):
            total += float(self.returns[e, d])
        return (total / n, float(length), float(delivered), float(self.ever_confirmed[e].sum()),
                float(delivered == self.m), float(first if first >= 0 else self.max_steps),
                float(self.connected_steps[e]) / (n * length),
                float(self.visited[e].sum()) / self.cells)

    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        rows = np.asarray(self.episodes, dtype=np.float64).reshape(-1, len(STAT_NAMES))
        if clear:
            self.episodes = []
        return EpisodeStats.from_sums(STAT_NAMES, len(rows), rows.sum(axis=0), (rows ** 2).sum(axis=0))

    # ---- exact state ---------------------------------------------------------
    def get_state(self, e: int) -> np.ndarray:
        state = {
            "step": self.step_count[e], "r_comm": self.ep_r_comm[e], "p_comm_drop": self.ep_p_drop[e],
            "t_confirm": self.ep_t_confirm[e], "m_deliver": self.ep_m_deliver[e],
            "first_delivery_step": self.first_delivery[e], "connected_steps": self.connected_steps[e],
            "drones": {"x": self.x[e], "y": self.y[e], "battery": self.battery[e],
                       "connected": self.connected[e], "last_comm_age": self.age[e],
                       "episode_return": self.returns[e], "scanning": self.scanning[e]},
            "victims": {"x": self.vx[e], "y": self.vy[e], "status": self.status[e],
                        "confirm_drone": self.confirm_drone[e], "progress": self.progress[e],
                        "owner": self.owner[e], "window": self.window[e],
                        "ever_confirmed": self.ever_confirmed[e]},
            "visited": self.visited[e], "own_visited": self.own_visited[e],
            "obstacles": self._obstacle_state(e),
        }
        return encode_state(state, self.config)

    def _obstacle_state(self, e: int) -> np.ndarray:
        out = np.zeros((self.n_obstacles, OBSTACLE_FIELDS))
        count = int(self.obstacle_count[e])
        out[:count, 0] = 1.0
        out[:count, 1:] = self.obstacles[e, :count]
        return out

    def set_state(self, e: int, values) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        if values.size != self.layout["size"]:
            raise ValueError(f"state has {values.size} values, expected {self.layout['size']}")
        if not state_is_valid(values, self.config):
            raise ValueError("state values are inconsistent for this env")
        s = decode_state(values, self.config)
        self.step_count[e] = int(s["step"])
        self.ep_r_comm[e], self.ep_p_drop[e] = f32(s["r_comm"]), f32(s["p_comm_drop"])
        self.ep_t_confirm[e], self.ep_m_deliver[e] = int(s["t_confirm"]), int(s["m_deliver"])
        self.first_delivery[e] = int(s["first_delivery_step"])
        self.connected_steps[e] = int(s["connected_steps"])
        dr, vi = s["drones"], s["victims"]
        self.x[e], self.y[e], self.battery[e] = dr["x"], dr["y"], dr["battery"]
        self.connected[e] = dr["connected"] != 0
        self.age[e] = dr["last_comm_age"]
        self.returns[e] = dr["episode_return"]
        self.scanning[e] = dr["scanning"] != 0
        self.vx[e], self.vy[e] = vi["x"], vi["y"]
        self.status[e], self.confirm_drone[e] = vi["status"], vi["confirm_drone"]
        self.progress[e], self.owner[e], self.window[e] = vi["progress"], vi["owner"], vi["window"]
        self.ever_confirmed[e] = vi["ever_confirmed"] != 0
        self.visited[e], self.own_visited[e] = s["visited"], s["own_visited"]
        present = s["obstacles"][s["obstacles"][:, 0] != 0, 1:]
        self.obstacles[e] = 0.0
        self.obstacles[e, :len(present)] = present
        self.obstacle_count[e] = len(present)
        self._observe(np.array([e]), None)


def _is_int(v, low, high) -> bool:
    return bool(np.all((v == np.floor(v)) & (v >= low) & (v <= high)))


def state_is_valid(values, config) -> bool:
    """The checks env_set_state makes in C (same rules, same order of fields)."""
    values = np.asarray(values, dtype=np.float64)
    lay = state_layout(config)
    if values.size != lay["size"] or not np.all(np.isfinite(values)):
        return False
    n, m, size = int(config["n_drones"]), int(config["n_victims"]), float(config["world_size"])
    step, r_comm, p, t_confirm, m_deliver, first, conn = values[:7]
    if not (_is_int(step, 0, config["max_steps"] - 1) and 0.001 <= r_comm <= 1e4 and 0 <= p <= 1
            and _is_int(t_confirm, 1, 1e6) and _is_int(m_deliver, 0, 1e6)
            and _is_int(first, -1, 1e7) and _is_int(conn, 0, 1e9)):
        return False
    drones = values[lay["drones"]: lay["victims"]].reshape(n, len(DRONE_KEYS))
    if not (np.all((drones[:, 0] >= 0) & (drones[:, 0] <= size) & (drones[:, 1] >= 0) & (drones[:, 1] <= size))
            and np.all((drones[:, 2] >= 0) & (drones[:, 2] <= 1))
            and _is_int(drones[:, 3], 0, 1) and _is_int(drones[:, 4], 0, 1e9)
            and _is_int(drones[:, 6], 0, 1)):
        return False
    victims = values[lay["victims"]: lay["visited"]].reshape(m, len(VICTIM_KEYS))
    if not (np.all((victims[:, 0] >= 0) & (victims[:, 0] <= size) & (victims[:, 1] >= 0) & (victims[:, 1] <= size))
            and _is_int(victims[:, 2], 0, 2) and _is_int(victims[:, 3], -1, n - 1)
            and _is_int(victims[:, 4], 0, 1e6) and _is_int(victims[:, 5], -1, n - 1)
            and _is_int(victims[:, 6], 0, 1e6) and _is_int(victims[:, 7], 0, 1)):
        return False
    if np.any((victims[:, 2] == CONFIRMED) & (victims[:, 5] < 0)):
        return False  # a confirmed report needs an owner
    if not _is_int(values[lay["visited"]: lay["obstacles"]], 0, 2.0**32 - 1):
        return False
    # obstacles: present 0/1, corners in the world, x0 < x1, y0 < y1, interiors
    # disjoint, no drone inside one (compared in float32, as C stores them)
    obstacles = values[lay["obstacles"]:].reshape(-1, OBSTACLE_FIELDS)
    if not (_is_int(obstacles[:, 0], 0, 1) and np.all((obstacles[:, 1:] >= 0) & (obstacles[:, 1:] <= size))):
        return False
    rects = obstacles[obstacles[:, 0] != 0, 1:].astype(np.float32)
    if not np.all((rects[:, 0] < rects[:, 2]) & (rects[:, 1] < rects[:, 3])):
        return False
    px, py = drones[:, 0].astype(np.float32), drones[:, 1].astype(np.float32)
    for a, r in enumerate(rects):
        if np.any((px > r[0]) & (px < r[2]) & (py > r[1]) & (py < r[3])):
            return False
        for q in rects[:a]:
            if r[0] < q[2] and q[0] < r[2] and r[1] < q[3] and q[1] < r[3]:
                return False
    return True


def _rect_d2(rect, x, y):
    """Squared float32 distance from (x, y) to rectangle (x0, y0, x1, y1), 0 inside."""
    gx = max(max(rect[0] - x, x - rect[2]), f32(0))
    gy = max(max(rect[1] - y, y - rect[3]), f32(0))
    return gx * gx + gy * gy
