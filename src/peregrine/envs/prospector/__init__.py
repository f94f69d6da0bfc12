"""Prospector: an asteroid-belt prospecting game as a native batch.

A ship flies a square belt of 12 asteroids (four ore types), scans them,
mines them, and sells the ore at 4 stations whose prices follow bounded,
mean-reverting random walks; stations also sell fuel and repairs and three
upgrades. Storm fields drift through the belt and damage the hull, and so do
fast collisions with asteroids. The episode ends on destruction or an empty
tank (terminal) or at `max_steps` (truncation).

Frozen interface: observation Box(260) float32, action Discrete(69) int32.
The last 69 observation floats are the action mask (1.0 = valid); an invalid
action is a no-op (the same as action 0, wait). `action_mask(observations)`
slices it out. Reward: change in credits times `reward_scale`, minus
`death_penalty` on a terminal step.

Full rules, the observation layout and the action table: docs/prospector.md.
C core: prospector.h; readable Python version: reference.py; baseline
policies: scripted.py.
"""
from __future__ import annotations

import numpy as np

from ..native.batch import NativeEnv
from . import _prospector

OBS_DIM = 260
NUM_ACTIONS = 69
NUM_ASTEROIDS, NUM_STATIONS, NUM_STORMS, NUM_ORES = 12, 4, 3, 4
ORE_NAMES = ("ice", "iron", "cobalt", "platinum")

# observation blocks (first index, length)
OBS_SHIP = slice(0, 24)
OBS_ASTEROIDS = slice(24, 132)      # 12 x 9
OBS_STATIONS = slice(132, 168)      # 4 x 9
OBS_STORMS = slice(168, 183)        # 3 x 5
OBS_BEST_PRICE = slice(183, 187)    # per ore
OBS_NEAREST_ORE = slice(187, 191)   # per ore
OBS_MASK = slice(191, 260)          # 69
ASTEROID_FEATURES, STATION_FEATURES, STORM_FEATURES = 9, 9, 5

# action groups (first index)
WAIT, THRUST, BOOST, BRAKE, WIDE_SCAN, SCAN, MINE = 0, 1, 9, 17, 18, 19, 31
DOCK, UNDOCK, SELL, SELL_ALL, BUY_FUEL, FILL_FUEL = 43, 44, 45, 49, 50, 51
REPAIR, FULL_REPAIR, JETTISON, UPGRADE, STEER_STATION, STEER_ORE = 52, 53, 54, 58, 61, 65
COMPASS = ("N", "NE", "E", "SE", "S", "SW", "W", "NW")


def action_names() -> list[str]:
    """Human-readable name of each of the 69 actions, in index order."""
    names = ["wait"]
    names += [f"thrust_{d}" for d in COMPASS]
    names += [f"boost_{d}" for d in COMPASS]
    names += ["brake", "wide_scan"]
    names += [f"scan_{i}" for i in range(NUM_ASTEROIDS)]
    names += [f"mine_{i}" for i in range(NUM_ASTEROIDS)]
    names += ["dock", "undock"]
    names += [f"sell_{ore}" for ore in ORE_NAMES]
    names += ["sell_all", "buy_fuel", "fill_fuel", "repair", "full_repair"]
    names += [f"jettison_{ore}" for ore in ORE_NAMES]
    names += ["upgrade_hold", "upgrade_drill", "upgrade_shield"]
    names += [f"steer_station_{j}" for j in range(NUM_STATIONS)]
    names += [f"steer_{ore}" for ore in ORE_NAMES]
    assert len(names) == NUM_ACTIONS
    return names


def action_mask(observations) -> np.ndarray:
    """Boolean mask of valid actions, shape (..., 69), from observations (..., 260).

    A view-free copy: the observation buffer is overwritten by the next step.
    """
    observations = np.asarray(observations)
    if observations.shape[-1:] != (OBS_DIM,):
        raise ValueError(f"observations must have last dimension {OBS_DIM}, "
                         f"got shape {observations.shape}")
    return observations[..., OBS_MASK] > 0.5


class Prospector(NativeEnv):
    name = "prospector"
    native_module = _prospector
    # Observation columns holding the action mask; the trainer masks invalid actions with it.
    action_mask_slice = OBS_MASK
    presets = {
        "default": {},
        # calmer belt for first experiments: no storms' damage, no collisions
        "calm": {"storm_damage": 0.0, "collision_damage": 0.0},
        # short episodes for quick tests and smoke runs
        "short": {"max_steps": 200},
    }

    @classmethod
    def resolve_config(cls, config: dict) -> dict:
        resolved = super().resolve_config(config)
        if resolved["storm_radius_min"] > resolved["storm_radius_max"]:
            raise ValueError(f"config field 'storm_radius_min' = {resolved['storm_radius_min']!r} "
                             f"must be <= storm_radius_max = {resolved['storm_radius_max']!r}")
        if resolved["ore_min"] > resolved["ore_max"]:
            raise ValueError(f"config field 'ore_min' = {resolved['ore_min']!r} "
                             f"must be <= ore_max = {resolved['ore_max']!r}")
        return resolved

    def action_mask(self) -> np.ndarray:
        """Valid actions for the current observations, (num_agents, 69) bool."""
        return action_mask(self.observations)
