"""DroneSwarm: multi-agent search and rescue under a communication constraint.

The rules are docs/drone_swarm_spec.md; this docstring records every
choice the spec leaves open, identically in the C core (drone_swarm.h) and the
NumPy reference (reference.py).

Rows: one per drone (agents_per_env = n_drones), instance-major.
Actions: float32 [rows, 3] = (vx, vy, scan) in [-1, 1]; NaN/inf -> 0, then
clamped to [-1, 1]; (vx, vy) scaled to unit length when its norm exceeds 1.
Observations: float32 [rows, 10 + 3 * obs_n_nearest + 4 * obs_n_obstacles + obs_report
+ 3 * obs_network + obs_drone_id + 4 * obs_n_neighbours],
all in [-1, 1]:
    0 x/L   1 y/L   2 battery   3 dist_to_base/L   4 connected
    5 last_comm_age/max_steps   6 live neighbours within r_comm/(n_drones-1)
    (0 when n_drones = 1)   7 min(nearest live neighbour dist/r_comm, 1)
    (1 with no live neighbour)   8, 9 unit vector to base (0, 0 at the base)
    then per detection slot (dx/L, dy/L, p), nearest first, ties by victim
    index; zero where empty or when the drone did not scan this step;
    then per obstacle slot (x0 - x, y0 - y, x1 - x, y1 - y) / L, the corners
    of the obs_n_obstacles nearest obstacles (squared distance from the drone
    to the rectangle, ties by obstacle index), zero where there are fewer;
    then, with obs_report = 1 (off by default, so the spec's layout is kept),
    the drone's report: 0 when it owns no confirmed, undelivered victim, else
    (window + 1) / (m_deliver + 1) of its most urgent one, in (0, 1] (1 on
    the confirmation step). A drone knows what it has confirmed; without
    this column a memoryless policy cannot tell that it carries a report
    that must reach the base within m_deliver steps; then, with
    obs_network = 1 (off by default), the nearest node a report could be
    handed to: the base or another connected drone (squared distance, ties to
    the base, then the lower index), as a unit vector (0, 0 on top of it) and
    distance / L; then, with obs_drone_id = 1 (off by default), the drone's
    index d / (n_drones - 1) (0 with one drone), so that one shared policy can
    give drones roles; then, with obs_n_neighbours = K > 0 (0 by default), K
    slots of what the drone hears from the other live drones within the
    episode's r_comm (radio range; a link p_comm_drop dropped is still heard),
    nearest first by squared distance, ties by index: their offset
    (dx, dy) / r_comm, connected flag and report (as the obs_report column),
    zero past the drones in range. These are off by default (the spec's
    layout) and are the agent's, not the world's: evaluating a checkpoint in
    another preset keeps them (`agent_fields`).

Choices (where the spec is silent)
- A drone is *active* in a step when its battery is > 0 at the start of the
  step: only active drones move, scan, explore and pay energy (speed ratio
  = |clipped action velocity|^2, the commanded speed even when a wall stops
  it). A drone is *alive* when its battery is > 0 after the drain: only alive
  drones link, relay, count as neighbours and get dispersion/connection terms.
  A drone that empties its battery this step still scans this step.
- Link drops (p_comm_drop > 0): each candidate link (alive, within r_comm)
  draws one uniform u and is up iff u >= p. Draw order: base links for drones
  0..n-1, then drone pairs (i, j), i < j, lexicographic. No draws when p = 0.
  Neighbour features count drones by distance (drops do not hide neighbours).
- Confirmation: nearest scanning drone by squared distance, ties to the
  lowest index. A report: on confirmation its window is m_deliver; in the
  delivery phase an undelivered confirmed victim is delivered if its owner
  is connected, else lost if the window is 0, else the window counts down.
  So it is delivered if the owner connects on the confirmation step or any of
  the next m_deliver steps. A lost report makes the victim unknown again
  (progress 0, no confirming drone).
- Detections: candidates are (scanning drone, undelivered victim) pairs with
  d^2 <= r_sense^2; each draws one uniform u in (drone, victim) order and is
  detected iff u < p, p = clamp((1 - d / r_sense) * detect_prob_scale, 0, 1).
- Scan-near reward: a scanning drone with a victim still unknown (status 0,
  after this step's confirmation/delivery) within 2 * r_confirm_radius.
- Exploration: cells of side cell_size (10 by default), ceil(L / cell_size)
  per side (at most 128); the cells where drones spawn count as visited (no
  reward). Active drones are processed in index order, so of two drones
  entering a new cell in one step the lower index gets the global bonus.
- Dispersion with no other live drone: distance = inf, so +r_dispersion.
- Reward terms, summed in float32 in this order: r_time, -c_energy * ratio^2,
  delivery share, r_confirm * confirmations, r_explore * (global + 0.5 * own),
  scan-near, dispersion, r_connect if connected. The delivery share is one
  term: (share + r_deliver_owner * own reports delivered this step) +
  r_report_lost * own reports lost this step (owner-credit terms, 0 by default,
  not in the spec: they pay the drone that confirmed, on its report's delivery
  or loss).
- Reset: randomisation draws (if randomise), then obstacles, then drones (uniform in the disc of
  radius spawn_radius around the base, clipped to the world, by rejection
  sampling in the bounding box; after 64 rejections the drone starts at the
  base), then victims (uniform in the annulus inside the world by rejection in
  the bounding box; after 256 rejections the last draw is kept). Batteries
  1, comm ages 0, connectivity computed without drops, no detections.
- Randomisation (randomise = 1), drawn at every reset in this order:
  r_comm ~ U[r_comm_min, r_comm_max), p_comm_drop ~ U[p_comm_drop_min,
  p_comm_drop_max), t_confirm = a uniform pick among t_confirm_choice_0..3 that
  are not -1, m_deliver likewise among m_deliver_choice_0..3 (no draw, and the
  fixed value, when all four are -1).
- base_x/base_y = -1 mean the centre (resolve_config substitutes L/2);
  spawn_radius = -1 means the episode's r_comm (resolved at every reset,
  since r_comm may be randomised).
- Obstacles (n_obstacles > 0): axis-aligned rectangles [x0, x1] x [y0, y1]
  drawn at every reset, after the randomisation draws and before the drones:
  per obstacle up to 64 tries of w ~ U[obstacle_min_size, obstacle_max_size),
  h likewise, x0 ~ U[obstacle_margin, L - obstacle_margin - w), y0 likewise
  (x1 = min(x0 + w, L)); a try is kept when the rectangle's distance to the
  base is >= obstacle_base_clearance and its gap to every kept obstacle is
  >= obstacle_separation along x or along y; an obstacle with no kept try is
  left out (the state lists the placed ones first). "Inside" means strictly
  inside: faces are outside. Drones and victims spawn outside (an extra
  rejection condition; no draws change when there are no obstacles).
  Movement is resolved axis by axis, x first at the old y, then y at the new
  x; a drone whose move would cross an interior stops on the first face in
  its way (and slides along it with the other axis), so it never ends a step
  inside and never tunnels through. The speed ratio is still the commanded
  one. Line of sight: a victim is hidden from a drone when the segment
  between them crosses an obstacle's interior; a hidden victim is out of
  range for that drone in phases 4 and 6 (no confirmation, no detection, no
  draw, no scan-near reward). Radio is not blocked: links, relaying and
  connectivity ignore obstacles (drones fly over the terrain the obstacles
  stand for in sight only; keeping radio free keeps the connectivity rule and
  its cost unchanged). Exploration cells ignore obstacles too.
- End: terminal when all victims are delivered or all batteries are empty;
  truncated (and not terminal) when the step counter reaches max_steps.

Episode statistics (in order): episode_return (mean over drones of the
per-drone return), episode_length, delivered, confirmed (distinct victims
confirmed at least once), success (1 if all delivered), time_to_first_delivery
(step number of the first delivery, max_steps when none), connected_fraction
(connected drone-steps / (n_drones * length)), explored_fraction (visited cells
/ all cells at the end, spawn cells included).

State layout (get_state/set_state, flat float64; n = n_drones, m = n_victims,
W = ceil(cells / 32) words of 32 bits per visited-cell bitset; no obstacle
fields when n_obstacles = 0):

    offset                 field
    0                      step counter
    1                      r_comm of this episode
    2                      p_comm_drop of this episode
    3                      t_confirm of this episode
    4                      m_deliver of this episode
    5                      first delivery step (-1 = none yet)
    6                      connected drone-steps so far
    7 + 7*d + k            drone d, k: 0 x, 1 y, 2 battery, 3 connected (0/1),
                           4 last_comm_age, 5 return so far, 6 scanned last step
    7 + 7n + 8*v + k       victim v, k: 0 x, 1 y, 2 status (0 unknown,
                           1 confirmed, 2 delivered), 3 confirming drone (-1),
                           4 progress, 5 owner (-1), 6 delivery window left,
                           7 ever confirmed (0/1)
    7 + 7n + 8m + w        cells visited by any drone, bits of word w
                           (cell c = cy * cells_per_side + cx is bit c % 32 of
                           word c // 32)
    7 + 7n + 8m + W(1+d) + w   cells visited by drone d
    7 + 7n + 8m + W(1+n) + 5*o + k   obstacle slot o < n_obstacles, k: 0 present
                           (0/1), 1 x0, 2 y0, 3 x1, 4 y1 (set_state refuses
                           corners outside the world, x0 >= x1, overlapping
                           interiors and a drone inside one)
reference.decode_state(values, config) returns these as named arrays and
encode_state does the reverse. set_state refuses inconsistent values and
rewrites the instance's observations (no detections).

Global state (`enable_states()`, float32 [num_envs, state_dim], every value in
[-1, 1]; written only once enabled; what a centralised critic reads, not the
exact state above). L = world_size, T = max_steps; state_dim = 4 + 7n + 6m +
5 * n_obstacles:

    offset                 field
    0                      step counter / T
    1                      r_comm of this episode / L
    2                      p_comm_drop of this episode
    3                      cells visited by any drone / all cells
    4 + 7*d + k            drone d, k: 0 x/L, 1 y/L, 2 battery, 3 connected (0/1),
                           4 last_comm_age / T, 5 scanned last step (0/1),
                           6 its report, as the obs_report column (0 when it owns
                           no confirmed, undelivered victim)
    4 + 7n + 6*v + k       victim v, k: 0 x/L, 1 y/L, 2 confirmed (0/1),
                           3 delivered (0/1), 4 (window + 1) / (m_deliver + 1)
                           while confirmed, else 0, 5 confirmation progress /
                           t_confirm of this episode
    4 + 7n + 6m + 5*o + k  obstacle slot o: 0 present (0/1), 1 x0/L, 2 y0/L,
                           3 x1/L, 4 y1/L (zero when absent; placed ones first)
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..native.batch import NativeEnv

from . import _drone_swarm

if TYPE_CHECKING:   # PettingZoo is an optional extra
    from .parallel import DroneSwarmParallelEnv

# The config table and statistic names live once, in drone_swarm.h (ENV_CONFIG,
# ENV_STATS); (name, default, min, max, is_integer) rows in config order.
CONFIG_FIELDS = _drone_swarm.config_fields()
STAT_NAMES = _drone_swarm.stat_names()

# The flat state's and the global state's block sizes (layout in the module
# docstring), read from drone_swarm.h (ENV_CONSTANTS) rather than restated here.
_LAYOUT = _drone_swarm.constants()
MAX_CELLS_PER_SIDE = _LAYOUT["max_cells_per_side"]
HEADER_SIZE = _LAYOUT["header_size"]
DRONE_FIELDS = _LAYOUT["drone_fields"]
VICTIM_FIELDS = _LAYOUT["victim_fields"]
OBSTACLE_FIELDS = _LAYOUT["obstacle_fields"]
STATE_HEADER = _LAYOUT["state_header"]
STATE_DRONE = _LAYOUT["state_drone"]
STATE_VICTIM = _LAYOUT["state_victim"]
STATE_OBSTACLE = _LAYOUT["state_obstacle"]


def observation_slots(config) -> tuple[tuple[str, int, int, int], ...]:
    """The repeated slots of a drone's observation, (name, first column, slots,
    columns per slot), for permutation-invariant encoders (policy.slot_encoder):
    the detection slots (dx, dy, p) after the 10 own features, then the obstacle
    slots (x0, y0, x1, y1); an empty slot is all zeros. Groups with no slot are
    left out. The layout is the module docstring's (drone_swarm.h writes it)."""
    k, k_obstacles = int(config["obs_n_nearest"]), int(config["obs_n_obstacles"])
    groups = (("detections", 10, k, 3), ("obstacles", 10 + 3 * k, k_obstacles, 4))
    return tuple(group for group in groups if group[2] > 0)


def global_state_dim(config) -> int:
    """Width of the global state for a config (the C header's pg.state_dim)."""
    return (STATE_HEADER + STATE_DRONE * int(config["n_drones"])
            + STATE_VICTIM * int(config["n_victims"])
            + STATE_OBSTACLE * int(config.get("n_obstacles", 0)))


def cells_per_side(config) -> int:
    return max(1, int(math.ceil(float(config["world_size"]) / float(config["cell_size"]))))


def state_layout(config) -> dict:
    """Offsets and sizes of the flat state (see the module docstring)."""
    n, m = int(config["n_drones"]), int(config["n_victims"])
    side = cells_per_side(config)
    words = (side * side + 31) // 32
    drones = HEADER_SIZE
    victims = drones + DRONE_FIELDS * n
    visited = victims + VICTIM_FIELDS * m
    own = visited + words
    obstacles = own + words * n
    return {"drones": drones, "victims": victims, "visited": visited, "own_visited": own,
            "obstacles": obstacles, "words": words, "cells_per_side": side,
            "size": obstacles + OBSTACLE_FIELDS * int(config.get("n_obstacles", 0))}


WILDERNESS = {"world_size": 120.0, "n_drones": 10, "n_victims": 8, "r_comm": 15.0, "r_sense": 30.0,
              "r_confirm_radius": 5.0, "t_confirm": 2, "m_deliver": 240, "victim_min_dist": 35.0,
              "victim_max_dist": 55.0, "spawn_radius": 12.0, "max_steps": 1000}


class DroneSwarm(NativeEnv):
    """Search and rescue with a relay network; one row per drone (see module doc)."""

    name = "drone_swarm"
    native_module = _drone_swarm
    presets = {
        "default": {},
        # distribution shift for evaluation
        "short_radio": {"r_comm": 10.0},
        "link_drops": {"p_comm_drop": 0.1},
        "many_victims": {"n_victims": 30},
        "randomised": {"randomise": 1},
        "large_area": {"world_size": 200.0, "n_drones": 16, "n_victims": 20,
                       "victim_max_dist": 140.0},
        # the reference's (PufferDroneSwarm) hard wilderness world, and with obstacles
        "wilderness": WILDERNESS,
        "wilderness_obstacles": {**WILDERNESS, "n_obstacles": 3, "obstacle_max_size": 18.0,
                                 "obs_n_obstacles": 2},
        "wilderness_obstacles_hard": {**WILDERNESS, "n_obstacles": 6, "obstacle_max_size": 25.0,
                                      "obs_n_obstacles": 3},
    }

    #: observation columns that belong to the agent, not the world: evaluating a
    #: checkpoint in another preset keeps its values (peregrine.evaluate.eval_world)
    agent_fields = ("obs_report", "obs_network", "obs_drone_id", "obs_n_neighbours")

    #: tests/fuzz_native.py also sets every field to its extremes on this preset
    fuzz_preset = "wilderness_obstacles_hard"

    @classmethod
    def resolve_config(cls, config: dict) -> dict:
        """Range checks (NativeEnv), the centre default for the base, cross-field rules."""
        c = super().resolve_config(config)
        size = c["world_size"]
        for axis in ("base_x", "base_y"):
            if c[axis] == -1.0:
                c[axis] = size / 2.0
            elif not 0.0 <= c[axis] <= size:
                raise ValueError(f"config field {axis!r} = {c[axis]!r} must be -1 (centre) or "
                                 f"in [0, world_size = {size:g}]")
        if not (c["spawn_radius"] == -1.0 or c["spawn_radius"] >= 0.0):
            raise ValueError(f"config field 'spawn_radius' = {c['spawn_radius']!r} must be -1 "
                             "(= r_comm) or >= 0")
        if c["victim_min_dist"] > c["victim_max_dist"]:
            raise ValueError(f"config field 'victim_min_dist' = {c['victim_min_dist']:g} must be "
                             f"<= victim_max_dist = {c['victim_max_dist']:g}")
        far_x = max(c["base_x"], size - c["base_x"])
        far_y = max(c["base_y"], size - c["base_y"])
        farthest = math.sqrt(far_x * far_x + far_y * far_y)
        if c["victim_min_dist"] > farthest:
            raise ValueError(f"config field 'victim_min_dist' = {c['victim_min_dist']:g} puts the "
                             f"victim annulus outside the world: the farthest point of the world "
                             f"is {farthest:g} from the base")
        side = cells_per_side(c)
        if side > MAX_CELLS_PER_SIDE:
            raise ValueError(f"config field 'cell_size' = {c['cell_size']:g} gives {side} cells per "
                             f"side for world_size {size:g}; at most {MAX_CELLS_PER_SIDE} allowed")
        if c["r_comm_min"] > c["r_comm_max"]:
            raise ValueError(f"config field 'r_comm_min' = {c['r_comm_min']:g} must be <= "
                             f"r_comm_max = {c['r_comm_max']:g}")
        if c["p_comm_drop_min"] > c["p_comm_drop_max"]:
            raise ValueError(f"config field 'p_comm_drop_min' = {c['p_comm_drop_min']:g} must be "
                             f"<= p_comm_drop_max = {c['p_comm_drop_max']:g}")
        if c["n_obstacles"] > 0:
            if c["obstacle_min_size"] > c["obstacle_max_size"]:
                raise ValueError(f"config field 'obstacle_min_size' = {c['obstacle_min_size']:g} "
                                 f"must be <= obstacle_max_size = {c['obstacle_max_size']:g}")
            if c["obstacle_max_size"] + 2.0 * c["obstacle_margin"] > size:
                raise ValueError(f"config field 'obstacle_max_size' = {c['obstacle_max_size']:g} "
                                 f"plus twice obstacle_margin = {c['obstacle_margin']:g} must fit "
                                 f"in world_size = {size:g}")
        for k in range(4):
            name = f"t_confirm_choice_{k}"
            if c[name] == 0:
                raise ValueError(f"config field {name!r} = 0 must be -1 (unused) or >= 1")
        return c

    def observation_bounds(self):
        return -1.0, 1.0

    @property
    def observation_slots(self) -> tuple[tuple[str, int, int, int], ...]:
        """The observation's repeated slots (see `observation_slots`)."""
        return observation_slots(self.config)

    @property
    def state_layout(self) -> dict:
        return state_layout(self.config)


def _pettingzoo_module():
    try:
        from . import parallel
    except ImportError as error:
        if getattr(error, "name", None) and error.name.split(".")[0] == "pettingzoo":
            raise ImportError("drone_swarm.parallel_env needs PettingZoo: pip install "
                              "'peregrine-rl[pettingzoo]'") from error
        raise
    return parallel


def parallel_env(render_mode: str | None = None, **config: Any) -> DroneSwarmParallelEnv:
    """One DroneSwarm instance as a PettingZoo ParallelEnv (agents drone_0 ...),
    made the way PettingZoo's own envs are; needs the `pettingzoo` extra.
    Keywords: DroneSwarm's config fields, `preset`, `render_size`, `max_cycles`.
    See parallel.py."""
    return _pettingzoo_module().parallel_env(render_mode=render_mode, **config)


def env(render_mode: str | None = None, **config: Any):
    """The same as PettingZoo's AEC env (agents act in turn): parallel_to_aec
    over parallel_env(...), as PettingZoo's own modules offer `env()`."""
    return _pettingzoo_module().env(render_mode=render_mode, **config)
