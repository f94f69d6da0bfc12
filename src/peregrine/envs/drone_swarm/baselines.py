"""Scripted DroneSwarm policies: yardsticks for learned ones.

Every policy acts on a whole batch at once (NumPy over rows; per-row memory
lives in arrays) through the same interface:

    policy.reset(env)                    # reads env.config, env.agents_per_env, env.num_agents
    actions = policy(observations)       # float32 [rows, 3] = (vx, vy, scan)
    policy.observe_done(terminals, truncations)   # optional: which rows just restarted

They see only what the observations show, plus the env's configuration
(world size, radio range, ...). When `observe_done` is not called, a new
episode is recognised by every drone of an instance having a full battery,
which is true only on an episode's first observation whenever a step costs
energy (c_idle > 0 or the policy moves or scans, as these ones do).

Policies
- `random`: uniform actions in [-1, 1]^3.
- `lawnmower`: half the drones sweep vertical strips of the world in
  boustrophedon lanes; the others are relays, each holding a point on the line
  from the base to "its" sweeper so that the sweeper's link to the base is a
  chain of short hops.
- `voronoi`: the area the victims can be in is split into one Voronoi cell per
  drone (seed points from a few Lloyd iterations over a grid); each drone
  tours the grid points of its own cell.

What makes them competent (shared by `lawnmower` and `voronoi`, see
`ScriptedSwarm`): a drone that detects a victim claims it (one drone per
victim, so two drones never take turns being "nearest" and reset each
other's progress); it confirms only when the report can get home in time,
i.e. when the connected network (the base and the drones whose observation
says "connected") is within reach: distance - r_comm <= v_max * (m_deliver -
margin). Otherwise it waits beside the victim and recruits idle drones as a
relay chain along the line base -> victim, then confirms. To confirm, it flies
onto the victim's position (read from its detection slot), stops, and scans
t_confirm + 1 consecutive steps; then it flies to the nearest connected node
until its own observation says it is connected (delivered), or gives up when
the delivery window has passed (the victim becomes unknown again and will be
detected again). Drones that are confirming or carrying a report do not scan
on the way, so they never steal another drone's confirmation.

The controller of an instance reads the observation rows of all its drones
(their positions and connection flags), i.e. it is a centralised scripted
controller; it uses no hidden state of the simulator.

Obstacles (when the observations carry obstacle slots, obs_n_obstacles > 0):
the controller remembers every obstacle any of its drones has observed this
episode (corners from the slots). A drone whose straight path to its goal
crosses a remembered obstacle flies instead to the corner (of the rectangle
grown by `detour_clearance`) that is reachable in a straight line and
shortest via to the goal; goals inside a remembered obstacle are pushed out
of it; search waypoints inside one are skipped, and so is a waypoint a drone
makes no progress towards for `stuck_steps` steps (an obstacle not yet seen).
Without obstacle slots none of this runs and the policies act as before.
"""
from __future__ import annotations

import math

import numpy as np

SEARCH, WAIT, CONFIRM, DELIVER, HELP = 0, 1, 2, 3, 4
MODE_NAMES = ("search", "wait", "confirm", "deliver", "help")


def _clip_unit(vectors: np.ndarray) -> np.ndarray:
    """Scales rows of (..., 2) down to unit length where longer."""
    norm = np.sqrt((vectors * vectors).sum(-1, keepdims=True))
    return vectors / np.maximum(norm, 1.0)


def effective_parameters(config: dict) -> dict:
    """The rule parameters a policy must plan for, conservatively.

    With per-episode randomisation the policy cannot see this episode's draw,
    so it plans with the shortest radio range, the longest confirmation and
    the shortest delivery window that can be drawn.
    """
    L = float(config["world_size"])
    r_comm = float(config["r_comm"])
    t_confirm = t_confirm_min = int(config["t_confirm"])
    m_deliver = m_deliver_max = int(config["m_deliver"])
    p_drop = float(config.get("p_comm_drop", 0.0))
    if int(config.get("randomise", 0)):
        r_comm = min(float(config.get("r_comm_min", r_comm)), float(config.get("r_comm_max", r_comm)))
        t_choices = [int(config[f"t_confirm_choice_{k}"]) for k in range(4)
                     if int(config.get(f"t_confirm_choice_{k}", -1)) != -1]
        m_choices = [int(config[f"m_deliver_choice_{k}"]) for k in range(4)
                     if int(config.get(f"m_deliver_choice_{k}", -1)) != -1]
        if t_choices:
            t_confirm, t_confirm_min = max(t_choices), min(t_choices)
        if m_choices:
            m_deliver, m_deliver_max = min(m_choices), max(m_choices)
        p_drop = max(p_drop, float(config.get("p_comm_drop_max", p_drop)))
    base_x = float(config.get("base_x", -1.0))
    base_y = float(config.get("base_y", -1.0))
    return {
        "obs_n_nearest": int(config.get("obs_n_nearest", 3)),
        "obs_n_obstacles": int(config.get("obs_n_obstacles", 0)),
        "n_obstacles": int(config.get("n_obstacles", 0)),
        "world_size": L,
        "base": np.array([L / 2 if base_x < 0 else base_x, L / 2 if base_y < 0 else base_y]),
        "r_comm": r_comm,
        "r_sense": float(config["r_sense"]),
        "r_confirm_radius": float(config["r_confirm_radius"]),
        "t_confirm": t_confirm,            # the longest that can be drawn
        "t_confirm_min": t_confirm_min,    # the shortest: a report may be out that early
        "m_deliver": m_deliver,            # the shortest window
        "m_deliver_max": m_deliver_max,    # the longest window
        "v_max": float(config["v_max"]) * float(config.get("dt", 1.0)),
        "p_comm_drop": p_drop,
        "victim_min_dist": float(config.get("victim_min_dist", 0.0)),
        "victim_max_dist": float(config.get("victim_max_dist", 2 * L)),
    }


class RandomPolicy:
    """Uniform random actions in [-1, 1]^3 (seeded)."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def reset(self, env) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.action_dim = int(env.single_action_space.shape[0]) if hasattr(env, "single_action_space") else 3

    def observe_done(self, terminals, truncations) -> None:
        pass

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        rows = observations.shape[0]
        return self.rng.uniform(-1.0, 1.0, (rows, getattr(self, "action_dim", 3))).astype(np.float32)


class ScriptedSwarm:
    """Claim -> (wait for a relay chain) -> confirm -> deliver, for every drone.

    Subclasses decide where drones go while searching (`search_targets`) and
    which detections a searching drone may claim (`may_claim`).
    """

    name = "scripted"
    #: steps of slack kept between the planned delivery run and m_deliver
    delivery_margin = 3
    #: relay spacing as a fraction of r_comm
    chain_spacing = 0.85
    #: steps a waiting drone waits for its relay chain before giving up
    wait_limit = 120
    #: steps a given-up victim is ignored by its instance
    ignore_steps = 150
    #: how far outside an obstacle's corner a detour passes
    detour_clearance = 2.0
    #: steps without progress after which a searching drone skips its waypoint
    stuck_steps = 6
    #: use the obstacle slots (False: obstacle-blind, for measuring what awareness buys)
    avoid_obstacles = True

    def __init__(self, seed: int = 0):
        self.seed = seed

    # ---- setup ---------------------------------------------------------------
    def reset(self, env) -> None:
        self.params = p = effective_parameters(env.config)
        self.n = int(env.agents_per_env)
        self.num_envs = int(env.num_agents) // self.n
        self.L = p["world_size"]
        self.base = p["base"]
        # A drone scans t_confirm + 1 steps, but the report may have been out since
        # step t_confirm_min of them: the rest of the window is what the run home gets.
        early = p["t_confirm"] + 1 - p["t_confirm_min"]
        self.reach = p["v_max"] * max(p["m_deliver"] - early - self.delivery_margin + 1, 0)
        self.spacing = self.chain_spacing * p["r_comm"]
        self.confirm_steps = p["t_confirm"] + 1
        self.claim_separation = max(p["r_confirm_radius"] + 1.0, 2.0)
        shape = (self.num_envs, self.n)
        self.mode = np.zeros(shape, np.int8)
        self.target = np.zeros(shape + (2,), np.float64)
        self.count = np.zeros(shape, np.int32)      # confirm: steps on target; deliver: steps since
        self.timer = np.zeros(shape, np.int32)      # steps in the current mode
        self.misses = np.zeros(shape, np.int32)     # confirm: steps the victim was not seen
        self.helped = np.zeros(shape, bool)         # wait: a chain was recruited
        self.helper_of = np.full(shape, -1, np.int32)
        self.ignore_pos = np.zeros(shape + (2,), np.float64)
        self.ignore_left = np.zeros(shape, np.int32)
        self.pending_reset = np.ones(self.num_envs, bool)
        # obstacles remembered from the observations: [E, n_obstacles, 4] corners
        self.obstacle_slots = p["obs_n_obstacles"] if p["n_obstacles"] > 0 and self.avoid_obstacles else 0
        self.known = np.zeros((self.num_envs, max(p["n_obstacles"], 1), 4))
        self.known_count = np.zeros(self.num_envs, np.int64)
        self.last_pos = np.zeros(shape + (2,))
        self.stuck = np.zeros(shape, np.int32)
        self.setup_plan()

    def setup_plan(self) -> None:
        """Precomputes the search plan (waypoints, roles) from the config."""

    def reset_instances(self, instances: np.ndarray) -> None:
        self.mode[instances] = SEARCH
        self.count[instances] = 0
        self.timer[instances] = 0
        self.misses[instances] = 0
        self.helped[instances] = False
        self.helper_of[instances] = -1
        self.ignore_left[instances] = 0
        self.known_count[instances] = 0
        self.stuck[instances] = 0

    def observe_done(self, terminals, truncations) -> None:
        ended = (np.asarray(terminals) | np.asarray(truncations)).reshape(self.num_envs, self.n)
        self.pending_reset |= ended.any(1)

    # ---- subclass hooks --------------------------------------------------------
    def search_targets(self, pos, live) -> np.ndarray:
        raise NotImplementedError

    def may_claim(self, pos, victims) -> np.ndarray:
        """(E, n, K) bool: may drone (e, i) claim detection k? Default: yes."""
        return np.ones(victims.shape[:3], bool)

    # ---- the step --------------------------------------------------------------
    def __call__(self, observations: np.ndarray) -> np.ndarray:
        E, n = self.num_envs, self.n
        obs = np.asarray(observations, dtype=np.float64).reshape(E, n, -1)
        L, p = self.L, self.params
        pos = obs[..., 0:2] * L
        battery = obs[..., 2]
        live = battery > 0.0
        connected = obs[..., 4] > 0.5
        slots = p["obs_n_nearest"]
        detections = obs[..., 10:10 + 3 * slots].reshape(E, n, slots, 3)
        seen = detections[..., 2] > 0.0
        victims = pos[:, :, None, :] + detections[..., 0:2] * L          # (E, n, K, 2)

        fresh = self.pending_reset | (battery >= 1.0).all(1)
        if fresh.any():
            self.reset_instances(np.flatnonzero(fresh))
        self.pending_reset[:] = False
        if self.obstacle_slots:
            self._remember_obstacles(pos, obs[..., 10 + 3 * slots:10 + 3 * slots + 4 * self.obstacle_slots])

        self.timer += 1
        self.ignore_left = np.maximum(self.ignore_left - 1, 0)
        mode = self.mode
        mode[~live] = SEARCH  # an empty drone does nothing; its claims lapse

        # Carrying a report: delivered once connected; lost after the window.
        delivering = mode == DELIVER
        self.count[delivering] += 1
        done = delivering & (connected | (self.count > p["m_deliver_max"] + 1))
        self._enter(done, SEARCH)

        # Confirming: done after confirm_steps on the victim; abort when the
        # victim is not there (delivered by someone else, or a bad estimate).
        confirming = mode == CONFIRM
        on_target = np.sqrt(((pos - self.target) ** 2).sum(-1)) < 1.0
        near = np.sqrt(((victims - self.target[:, :, None, :]) ** 2).sum(-1)) < 1.0
        still_there = (seen & near).any(-1)
        self.misses = np.where(confirming & on_target & ~still_there, self.misses + 1, 0)
        abandon = confirming & ((self.misses >= 3) | (self.timer > 2 * self.L / max(p["v_max"], 1e-6)
                                                      + 4 * self.confirm_steps + 10))
        self._enter(abandon, SEARCH)
        confirmed = confirming & ~abandon & (self.count >= self.confirm_steps)
        self._enter(confirmed, DELIVER)
        self.count[confirmed] = 1
        self._enter(confirmed & connected, SEARCH)   # delivered on the confirmation step

        # Helpers go back to searching when their requester no longer needs them.
        helping = mode == HELP
        owner = np.maximum(self.helper_of, 0)
        owner_mode = np.take_along_axis(mode, owner, 1)
        release = helping & ((self.helper_of < 0) | ((owner_mode != WAIT) & (owner_mode != CONFIRM)
                                                     & (owner_mode != DELIVER)))
        self._enter(release, SEARCH)

        self._claim(pos, live, seen, victims)
        self._wait_or_confirm(pos, live, connected)

        # Where each drone goes, and whether it scans.
        if self.obstacle_slots:
            self._track_progress(pos)
        goal = self.search_targets(pos, live)
        mode = self.mode
        busy = (mode == WAIT) | (mode == CONFIRM) | (mode == HELP)
        goal = np.where(busy[..., None], self.target, goal)
        waiting = mode == WAIT
        if waiting.any():  # hover just outside the confirmation radius
            away = pos - self.target
            dist = np.sqrt((away * away).sum(-1, keepdims=True))
            unit = np.where(dist > 1e-6, away / np.maximum(dist, 1e-6), np.array([1.0, 0.0]))
            hover = self.target + unit * (p["r_confirm_radius"] + 2.0)
            goal = np.where(waiting[..., None], hover, goal)
        delivering = mode == DELIVER
        if delivering.any():
            goal = np.where(delivering[..., None], self._nearest_connected(pos, live, connected), goal)

        if self.obstacle_slots:
            goal = self._navigate(pos, goal)
        velocity = _clip_unit((goal - pos) / max(p["v_max"], 1e-6))
        scan = (mode == SEARCH) | (mode == CONFIRM) | (mode == HELP)
        predicted = np.clip(pos + velocity * p["v_max"], 0.0, L)
        inside = np.sqrt(((predicted - self.target) ** 2).sum(-1)) <= max(p["r_confirm_radius"] - 0.25, 0.0)
        confirming = mode == CONFIRM
        self.count = np.where(confirming, np.where(inside, self.count + 1, 0), self.count)

        actions = np.empty((E, n, 3), np.float32)
        actions[..., 0:2] = velocity
        actions[..., 2] = np.where(scan & live, 1.0, -1.0)
        actions[~live] = 0.0
        return actions.reshape(E * n, 3)

    # ---- obstacles ---------------------------------------------------------------
    def _remember_obstacles(self, pos, slots) -> None:
        """Adds the obstacles in this step's observation slots to the instance's memory."""
        E, n = pos.shape[:2]
        rel = slots.reshape(E, n, -1, 4) * self.L
        corners = rel + np.concatenate([pos, pos], -1)[:, :, None, :]         # (E, n, K, 4)
        seen = (rel != 0).any(-1)
        capacity = self.known.shape[1]
        index = np.arange(capacity)[None]
        for i in range(n):
            for k in range(rel.shape[2]):
                candidate, valid = corners[:, i, k], seen[:, i, k]
                if not valid.any():
                    continue
                same = (np.abs(self.known - candidate[:, None, :]) < 0.5).all(-1)
                known = (same & (index < self.known_count[:, None])).any(1)
                add = np.flatnonzero(valid & ~known & (self.known_count < capacity))
                self.known[add, self.known_count[add]] = candidate[add]
                self.known_count[add] += 1

    def _known_live(self) -> np.ndarray:
        """(E, 1, O) bool: which slots of self.known hold a remembered obstacle."""
        return np.arange(self.known.shape[1])[None, None, :] < self.known_count[:, None, None]

    def _inside_known(self, points, grow: float) -> np.ndarray:
        """(E, k, O) bool: points (E, k, 2) strictly inside a remembered obstacle grown by `grow`."""
        r = self.known[:, None, :, :]
        x, y = points[..., 0:1], points[..., 1:2]
        return (self._known_live() & (x > r[..., 0] - grow) & (x < r[..., 2] + grow)
                & (y > r[..., 1] - grow) & (y < r[..., 3] + grow))

    def _segment_hits(self, a, b) -> np.ndarray:
        """(E, n, O) bool: does segment a -> b (E, n, 2) cross a remembered obstacle's interior?"""
        rects = self.known[:, None, :, :]
        live = self._known_live()
        a, d = a[:, :, None, :], (b - a)[:, :, None, :]
        shape = (a.shape[0], a.shape[1], self.known.shape[1])
        lo = np.full(shape, -np.inf)
        hi = np.full(shape, np.inf)
        ok = np.ones(shape, bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            for axis in (0, 1):
                step = d[..., axis]
                moving = step != 0
                t1 = (rects[..., axis] - a[..., axis]) / np.where(moving, step, 1.0)
                t2 = (rects[..., axis + 2] - a[..., axis]) / np.where(moving, step, 1.0)
                lo = np.where(moving, np.maximum(lo, np.minimum(t1, t2)), lo)
                hi = np.where(moving, np.minimum(hi, np.maximum(t1, t2)), hi)
                ok &= moving | ((a[..., axis] > rects[..., axis]) & (a[..., axis] < rects[..., axis + 2]))
        return live & ok & (lo < hi) & (lo < 1.0) & (hi > 0.0)

    def _navigate(self, pos, goal) -> np.ndarray:
        """Goals pushed out of remembered obstacles; a path blocked by one goes via a corner."""
        if not self.known_count.any():
            return goal
        g = self.detour_clearance
        grown = self.known + np.array([-g, -g, g, g])
        # a goal inside a grown obstacle moves to the nearest point of its boundary
        x, y = goal[..., 0:1], goal[..., 1:2]
        r = grown[:, None, :, :]
        inside = self._inside_known(goal, g)
        if inside.any():
            pushes = np.stack([r[..., 0] - x, r[..., 2] - x, r[..., 1] - y, r[..., 3] - y], -1)
            which = np.abs(pushes).argmin(-1)
            push = np.take_along_axis(pushes, which[..., None], -1)[..., 0]
            dx = np.where(inside & (which < 2), push, 0.0).sum(-1)
            dy = np.where(inside & (which >= 2), push, 0.0).sum(-1)
            goal = np.clip(goal + np.stack([dx, dy], -1), 0.0, self.L)
        hits = self._segment_hits(pos, goal)
        blocked = hits.any(-1)
        if not blocked.any():
            return goal
        # the corners of each drone's nearest blocking obstacle (by distance to its centre)
        centre = (self.known[..., 0:2] + self.known[..., 2:4]) / 2
        gap = np.sqrt(((centre[:, None] - pos[:, :, None]) ** 2).sum(-1))
        first = np.where(hits, gap, np.inf).argmin(-1)                           # (E, n)
        box = np.take_along_axis(grown, first.reshape(len(pos), -1)[..., None].repeat(4, -1), 1)
        corners = np.stack([box[..., [0, 1]], box[..., [2, 1]], box[..., [2, 3]], box[..., [0, 3]]], 2)
        corners = np.clip(corners, 0.0, self.L)                                  # (E, n, 4, 2)
        to_corner = np.sqrt(((corners - pos[:, :, None]) ** 2).sum(-1))
        to_goal = np.sqrt(((goal[:, :, None] - corners) ** 2).sum(-1))
        # from a corner that does not see the goal, the way on is round the box
        # via a neighbouring corner that does (greedy choices would oscillate)
        sees = np.stack([~self._segment_hits(corners[:, :, c], goal).any(-1) for c in range(4)], -1)
        direct = np.where(sees, to_goal, np.inf)
        edge = np.sqrt(((corners - np.roll(corners, 1, 2)) ** 2).sum(-1))      # corner c-1 -> c
        around = np.minimum(edge + np.roll(direct, 1, 2), np.roll(edge + direct, -1, 2))
        tail = np.where(sees, to_goal, around)
        tail = np.where(np.isfinite(tail), tail, to_goal)
        cost = to_corner + tail
        clear = np.stack([~self._segment_hits(pos, corners[:, :, c]).any(-1) for c in range(4)], -1)
        # a corner the drone is already at is no way forward
        clear &= to_corner > 0.25 * self.params["v_max"]
        cost = np.where(clear, cost, cost + 1e6)
        via = np.take_along_axis(corners, cost.argmin(-1)[..., None, None].repeat(2, -1), 2)[:, :, 0]
        return np.where(blocked[..., None], via, goal)

    def _reached(self, owners, current, pos) -> np.ndarray:
        """(E, k) bool for tour owners (drone indices): at the waypoint, or the waypoint
        is inside a remembered obstacle, or the drone is stuck short of it."""
        reached = np.sqrt(((current - pos) ** 2).sum(-1)) <= self.params["v_max"]
        if not self.obstacle_slots:
            return reached
        buried = self._inside_known(current, self.detour_clearance).any(-1)
        return reached | buried | (self.stuck[:, owners] >= self.stuck_steps)

    def _track_progress(self, pos) -> None:
        """Counts steps a searching drone barely moved (it is stuck on something)."""
        moved = np.sqrt(((pos - self.last_pos) ** 2).sum(-1)) >= 0.2 * self.params["v_max"]
        self.stuck = np.where(moved | (self.mode != SEARCH), 0, self.stuck + 1)
        self.last_pos = pos.copy()

    # ---- pieces ----------------------------------------------------------------
    def _enter(self, rows, mode) -> None:
        self.mode[rows] = mode
        self.timer[rows] = 0
        self.count[rows] = 0
        self.misses[rows] = 0
        if mode == SEARCH:
            self.helped[rows] = False
            self.helper_of[rows] = -1

    def _claimed_targets(self):
        claimed = (self.mode == WAIT) | (self.mode == CONFIRM) | (self.mode == DELIVER)
        return claimed, self.target

    def _claim(self, pos, live, seen, victims) -> None:
        E, n, K = seen.shape
        if K == 0:
            return
        searching = (self.mode == SEARCH) & live
        candidates = seen & searching[..., None]
        if not candidates.any():
            return
        candidates &= self.may_claim(pos, victims)
        # only the few detections of searching drones: (instance, drone, slot) triples
        e, i, k = np.nonzero(candidates)
        if e.size == 0:
            return
        points = victims[e, i, k]                                                  # (M, 2)
        claimed, targets = self._claimed_targets()
        gap = targets[e] - points[:, None, :]                                      # (M, n, 2)
        taken = (claimed[e] & ((gap * gap).sum(-1) < self.claim_separation ** 2)).any(1)
        gap = self.ignore_pos[e] - points[:, None, :]
        ignored = ((self.ignore_left[e] > 0) & ((gap * gap).sum(-1) < self.claim_separation ** 2)).any(1)
        keep = ~taken & ~ignored
        if not keep.any():
            return
        e, i, points = e[keep], i[keep], points[keep]
        distance = ((points - pos[e, i]) ** 2).sum(-1)
        # the nearest free detection of each drone
        row = e * n + i
        order = np.lexsort((distance, row))
        row, first = np.unique(row[order], return_index=True)
        choice = np.zeros((E, n, 2))
        wants = np.zeros((E, n), bool)
        wants.flat[row] = True
        choice.reshape(-1, 2)[row] = points[order[first]]
        # two drones choosing the same victim: the lower index keeps it
        busy = np.unique(row // n)
        pair = choice[busy, :, None, :] - choice[busy, None, :, :]
        pair = (pair * pair).sum(-1)
        lower = np.tril(np.ones((n, n), bool), -1)  # [i, j] = j < i
        wanting = wants[busy]
        clash = np.zeros((E, n), bool)
        clash[busy] = (wanting[:, :, None] & wanting[:, None, :] & lower
                       & (pair < self.claim_separation ** 2)).any(-1)
        wins = wants & ~clash
        self._enter(wins, WAIT)
        self.target[wins] = choice[wins]

    def _network_gap(self, points, pos, live, connected) -> np.ndarray:
        """Distance from each point (E, n, 2) to the nearest connected node, minus r_comm."""
        nodes = live & connected
        gap = points[:, :, None, :] - pos[:, None, :, :]
        gap = np.sqrt((gap * gap).sum(-1))
        gap = np.where(nodes[:, None, :] & ~np.eye(self.n, dtype=bool)[None], gap, np.inf)
        to_base = np.sqrt(((points - self.base) ** 2).sum(-1))
        return np.minimum(gap.min(-1), to_base) - self.params["r_comm"]

    def _nearest_connected(self, pos, live, connected) -> np.ndarray:
        nodes = live & connected
        gap = pos[:, :, None, :] - pos[:, None, :, :]
        gap = np.sqrt((gap * gap).sum(-1))
        gap = np.where(nodes[:, None, :] & ~np.eye(self.n, dtype=bool)[None], gap, np.inf)
        nearest = gap.argmin(-1)
        drone_pos = np.take_along_axis(pos, nearest[..., None].repeat(2, -1), 1)
        to_base = np.sqrt(((pos - self.base) ** 2).sum(-1))
        use_base = to_base <= gap.min(-1)
        return np.where(use_base[..., None], self.base, drone_pos)

    def _wait_or_confirm(self, pos, live, connected) -> None:
        waiting = (self.mode == WAIT) & live
        if not waiting.any():
            return
        gap = self._network_gap(self.target, pos, live, connected)
        ready = waiting & (gap <= self.reach)
        self._enter(ready, CONFIRM)
        waiting &= ~ready
        give_up = waiting & (self.timer > self.wait_limit)
        # Recruit a relay chain for the first waiting drone of each instance without one.
        needs = waiting & ~self.helped & ~give_up
        if needs.any():
            give_up |= self._recruit(needs, pos, live)
        if give_up.any():
            self.ignore_pos[give_up] = self.target[give_up]
            self.ignore_left[give_up] = self.ignore_steps
            self._enter(give_up, SEARCH)

    def _recruit(self, needs, pos, live) -> np.ndarray:
        """Sends idle drones to relay points base -> victim; returns rows that must give up."""
        E, n = needs.shape
        give_up = np.zeros_like(needs)
        requester = needs.argmax(1)
        instances = np.flatnonzero(needs.any(1))
        req = requester[instances]
        victim = self.target[instances, req]
        offset = victim - self.base
        distance = np.sqrt((offset * offset).sum(-1))
        unit = offset / np.maximum(distance, 1e-6)[:, None]
        spacing = max(self.spacing, 1e-6)
        links = np.ceil(np.maximum(distance - self.params["r_comm"] - self.reach, 0.0) / spacing)
        links = np.maximum(links, 1).astype(int)
        free = (self.mode[instances] == SEARCH) & live[instances]
        free[np.arange(len(instances)), req] = False
        too_few = free.sum(1) < links
        give_up[instances[too_few], req[too_few]] = True
        for j in range(1, int(links.max()) + 1 if len(links) else 1):
            active = (~too_few) & (links >= j)
            if not active.any():
                break
            point = self.base + unit * np.minimum(j * spacing, distance)[:, None]
            gap = pos[instances] - point[:, None, :]
            gap = np.sqrt((gap * gap).sum(-1))
            gap = np.where(free, gap, np.inf)
            pick = gap.argmin(1)
            rows_e, rows_i = instances[active], pick[active]
            self._enter_rows(rows_e, rows_i, HELP)
            self.target[rows_e, rows_i] = point[active]
            self.helper_of[rows_e, rows_i] = req[active]
            free[np.flatnonzero(active), pick[active]] = False
        ok = ~too_few
        self.helped[instances[ok], req[ok]] = True
        return give_up

    def _enter_rows(self, rows_e, rows_i, mode) -> None:
        mask = np.zeros(self.mode.shape, bool)
        mask[rows_e, rows_i] = True
        self._enter(mask, mode)


def _boustrophedon(x0: float, x1: float, L: float, lane_spacing: float, margin: float) -> np.ndarray:
    width = x1 - x0
    lanes = max(1, int(math.ceil(width / lane_spacing)))
    points = []
    for lane in range(lanes):
        x = x0 + (lane + 0.5) * width / lanes
        ys = (margin, L - margin) if lane % 2 == 0 else (L - margin, margin)
        points += [(x, ys[0]), (x, ys[1])]
    return np.array(points, np.float64)


class LawnmowerPolicy(ScriptedSwarm):
    """Sweepers mow vertical strips; relays hold a chain from the base to their sweeper."""

    name = "lawnmower"
    sweep_fraction = 0.5

    def setup_plan(self) -> None:
        n, L, p = self.n, self.L, self.params
        self.sweepers = max(1, int(round(n * self.sweep_fraction)))
        relays = n - self.sweepers
        lane = max(1.2 * p["r_sense"], 1e-3)
        margin = min(0.4 * p["r_sense"], L / 2)
        tours = [_boustrophedon(s * L / self.sweepers, (s + 1) * L / self.sweepers, L, lane, margin)
                 for s in range(self.sweepers)]
        longest = max(len(t) for t in tours)
        self.waypoints = np.zeros((self.sweepers, longest, 2))
        self.tour_length = np.array([len(t) for t in tours])
        for s, tour in enumerate(tours):
            self.waypoints[s, :len(tour)] = tour
        # relay r belongs to sweeper r % sweepers, at chain position r // sweepers + 1
        self.relay_owner = np.arange(relays) % self.sweepers
        self.relay_rank = np.arange(relays) // self.sweepers + 1
        self.chain_length = np.bincount(self.relay_owner, minlength=self.sweepers)
        self.waypoint = np.zeros((self.num_envs, self.sweepers), np.int64)
        self.direction = np.ones((self.num_envs, self.sweepers), np.int64)
        self.started = np.zeros((self.num_envs, self.sweepers), bool)

    def reset_instances(self, instances) -> None:
        super().reset_instances(instances)
        self.waypoint[instances] = 0
        self.direction[instances] = 1
        self.started[instances] = False

    def search_targets(self, pos, live) -> np.ndarray:
        S = self.sweepers
        sweeper_pos = pos[:, :S]
        if not self.started.all():  # start each tour at the waypoint nearest the sweeper
            d = self.waypoints[None] - sweeper_pos[:, :, None, :]
            d = (d * d).sum(-1)
            d = np.where(np.arange(self.waypoints.shape[1])[None, None] < self.tour_length[None, :, None], d, np.inf)
            nearest = d.argmin(-1)
            self.waypoint = np.where(self.started, self.waypoint, nearest)
            self.started[:] = True
        sweeping = self.mode[:, :S] == SEARCH
        current = self.waypoints[np.arange(S)[None], self.waypoint]              # (E, S, 2)
        reached = self._reached(np.arange(S), current, sweeper_pos)
        advance = sweeping & reached
        if advance.any():  # ping-pong along the tour
            step = self.waypoint + self.direction
            flip = (step < 0) | (step >= self.tour_length[None])
            self.direction = np.where(advance & flip, -self.direction, self.direction)
            self.waypoint = np.where(advance, self.waypoint + self.direction, self.waypoint)
            self.waypoint = np.clip(self.waypoint, 0, self.tour_length[None] - 1)
            current = self.waypoints[np.arange(S)[None], self.waypoint]
        goal = np.empty_like(pos)
        goal[:, :S] = current
        if self.n > S:
            anchor = sweeper_pos[:, self.relay_owner]                          # (E, R, 2)
            offset = anchor - self.base
            distance = np.sqrt((offset * offset).sum(-1, keepdims=True))
            unit = offset / np.maximum(distance, 1e-6)
            rank = self.relay_rank[None, :, None]
            links = self.chain_length[self.relay_owner][None, :, None] + 1
            along = np.minimum(rank * self.spacing, distance * rank / links)
            goal[:, S:] = self.base + unit * along
        return goal

    def may_claim(self, pos, victims) -> np.ndarray:
        # relays only take victims near their post, so the chain stays mostly intact
        allowed = np.ones(victims.shape[:3], bool)
        if self.n > self.sweepers:
            d = np.sqrt(((victims[:, self.sweepers:] - pos[:, self.sweepers:, None, :]) ** 2).sum(-1))
            allowed[:, self.sweepers:] = d <= 0.5 * self.params["r_sense"]
        return allowed


class VoronoiPolicy(ScriptedSwarm):
    """Each drone tours the grid points of its own Voronoi cell of the search area."""

    name = "voronoi"
    lloyd_iterations = 20

    def setup_plan(self) -> None:
        n, L, p = self.n, self.L, self.params
        spacing = max(0.8 * p["r_sense"], L / 64)
        margin = min(0.3 * p["r_sense"], L / 2)  # close to the walls: corners hold victims too
        ticks = np.linspace(margin, L - margin, max(1, int(math.ceil((L - 2 * margin) / spacing)) + 1))
        grid = np.stack(np.meshgrid(ticks, ticks, indexing="xy"), -1).reshape(-1, 2)
        # only where victims can be (with a sensing margin)
        dist = np.sqrt(((grid - self.base) ** 2).sum(-1))
        keep = (dist >= p["victim_min_dist"] - 0.5 * p["r_sense"]) & \
               (dist <= p["victim_max_dist"] + 0.5 * p["r_sense"])
        if keep.sum() >= n:
            grid = grid[keep]
        # Lloyd iterations from seeds spread by angle around the base
        angle = np.arctan2(grid[:, 1] - self.base[1], grid[:, 0] - self.base[0])
        order = np.argsort(angle, kind="stable")
        seeds = grid[order[np.linspace(0, len(grid) - 1, n).astype(int)]].copy()
        for _ in range(self.lloyd_iterations):
            owner = (((grid[:, None, :] - seeds[None]) ** 2).sum(-1)).argmin(1)
            for d in range(n):
                if (owner == d).any():
                    seeds[d] = grid[owner == d].mean(0)
        owner = (((grid[:, None, :] - seeds[None]) ** 2).sum(-1)).argmin(1)
        tours = []
        for d in range(n):
            points = grid[owner == d]
            if len(points) == 0:
                points = seeds[d:d + 1]
            # nearest-neighbour tour starting from the point closest to the base
            remaining = list(range(len(points)))
            start = int(np.argmin(((points - self.base) ** 2).sum(-1)))
            tour = [start]
            remaining.remove(start)
            while remaining:
                last = points[tour[-1]]
                nxt = min(remaining, key=lambda k: ((points[k] - last) ** 2).sum())
                tour.append(nxt)
                remaining.remove(nxt)
            tours.append(points[tour])
        longest = max(len(t) for t in tours)
        self.waypoints = np.zeros((n, longest, 2))
        self.tour_length = np.array([len(t) for t in tours])
        for d, tour in enumerate(tours):
            self.waypoints[d, :len(tour)] = tour
        self.seeds = seeds
        self.waypoint = np.zeros((self.num_envs, n), np.int64)
        self.direction = np.ones((self.num_envs, n), np.int64)

    def reset_instances(self, instances) -> None:
        super().reset_instances(instances)
        self.waypoint[instances] = 0
        self.direction[instances] = 1

    def search_targets(self, pos, live) -> np.ndarray:
        n = self.n
        current = self.waypoints[np.arange(n)[None], self.waypoint]
        reached = self._reached(np.arange(n), current, pos)
        advance = (self.mode == SEARCH) & reached
        if advance.any():
            step = self.waypoint + self.direction
            flip = (step < 0) | (step >= self.tour_length[None])
            self.direction = np.where(advance & flip, -self.direction, self.direction)
            self.waypoint = np.where(advance, self.waypoint + self.direction, self.waypoint)
            self.waypoint = np.clip(self.waypoint, 0, self.tour_length[None] - 1)
            current = self.waypoints[np.arange(n)[None], self.waypoint]
        return current


POLICIES = {"random": RandomPolicy, "lawnmower": LawnmowerPolicy, "voronoi": VoronoiPolicy}

