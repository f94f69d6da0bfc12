"""Baseline policies for Prospector, over a batch of observations.

* `random_policy`: uniform over the valid actions (read from the mask).
* `ScriptedTrader`: a hand-written trader: scan what is near, mine the nearest
  known asteroid, carry the hold to the station that pays most for it,
  refuel and repair there when low.

Both take observations (N, 260) and return int32 actions (N,), so they run
on any batch (the native env or the reference). `POLICIES` names them for
`peregrine.evaluate` (`peregrine eval prospector --policy trader`), which
plays the first episode of each instance with a fixed seed;
benchmarks/bench_prospector.py prints these as the baselines a trained
policy must beat.
"""
from __future__ import annotations

import numpy as np

from . import (BRAKE, DOCK, FILL_FUEL, FULL_REPAIR, MINE, NUM_ASTEROIDS, NUM_STATIONS, OBS_ASTEROIDS, OBS_BEST_PRICE, OBS_MASK,
               OBS_NEAREST_ORE, OBS_STATIONS, SCAN, SELL_ALL, STEER_ORE, STEER_STATION, THRUST,
               UNDOCK, WAIT, WIDE_SCAN, Prospector, action_mask)


def random_policy(observations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform over each row's valid actions (wait is always valid)."""
    mask = action_mask(observations)
    keys = rng.random(mask.shape) * mask  # invalid actions score 0, valid ones (0, 1)
    return keys.argmax(axis=1).astype(np.int32)


class ScriptedTrader:
    """Mine nearest, sell at the best price, refuel and repair when low.

    Reads only the observation, plus the config for units (world size, speeds,
    ranges and the ore base prices that the observation normalises by).
    Priorities, first that applies:
      docked:  sell the hold; fill the tank below 90%; repair below 70%; undock.
      flying, going home (hold 95% full, fuel < 30% or hull < 35%):
               dock if possible, brake when close and fast, else steer to the
               station paying most for the cargo (the nearest when the hold
               is empty).
      flying, prospecting: mine a minable asteroid; wide-scan if it finds
               something; brake when close to the target asteroid and fast;
               steer to the best known asteroid (ore value over distance);
               scan the nearest unscanned asteroid in range; otherwise thrust
               toward the nearest active asteroid.
    """

    def __init__(self, **config):
        c = Prospector.resolve_config(config)
        self.world = c["world_size"]
        self.max_speed = c["max_speed"]
        self.dock_range = c["dock_range"]
        self.dock_speed = c["dock_speed"]
        self.mine_range = c["mine_range"]
        self.safe_speed = c["safe_speed"]
        self.ore_price = np.array([c["price_ice"], c["price_iron"], c["price_cobalt"],
                                   c["price_platinum"]], np.float64)

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        obs = np.asarray(observations, np.float64)
        n = obs.shape[0]
        mask = obs[:, OBS_MASK] > 0.5
        docked = obs[:, 13] > 0.5
        fuel, hull, hold = obs[:, 4], obs[:, 5], obs[:, 6]
        cargo = obs[:, 8:12] * 1.0  # fractions of the hold, by ore
        speed = np.hypot(obs[:, 2], obs[:, 3]) * self.max_speed
        rows = np.arange(n)

        stations = obs[:, OBS_STATIONS].reshape(n, NUM_STATIONS, 9)
        station_dist = np.hypot(stations[:, :, 0], stations[:, :, 1]) * self.world
        prices = stations[:, :, 3:7] * self.ore_price  # credits per unit
        cargo_value = (cargo[:, None, :] * prices).sum(axis=2)
        has_cargo = hold > 0
        # the station paying most for this hold, or the nearest when empty
        target_station = np.where(has_cargo, cargo_value.argmax(axis=1), station_dist.argmin(axis=1))
        target_dist = station_dist[rows, target_station]

        asteroids = obs[:, OBS_ASTEROIDS].reshape(n, NUM_ASTEROIDS, 9)
        ast_dist = np.hypot(asteroids[:, :, 0], asteroids[:, :, 1]) * self.world
        ore_dist = obs[:, OBS_NEAREST_ORE] * self.world
        known_ore = obs[:, OBS_NEAREST_ORE] < 1.9
        best_price = obs[:, OBS_BEST_PRICE] * self.ore_price
        ore_score = np.where(known_ore, best_price / (ore_dist + 10.0), -1.0)
        target_ore = ore_score.argmax(axis=1)
        any_known = known_ore.any(axis=1)
        target_ore_dist = ore_dist[rows, target_ore]

        mine_ok = mask[:, MINE:MINE + NUM_ASTEROIDS]
        mine_choice = MINE + np.where(mine_ok, ast_dist, np.inf).argmin(axis=1)
        scan_ok = mask[:, SCAN:SCAN + NUM_ASTEROIDS]
        scan_choice = SCAN + np.where(scan_ok, ast_dist, np.inf).argmin(axis=1)
        active = asteroids[:, :, 2] > 0.5
        nearest_active = np.where(active, ast_dist, np.inf).argmin(axis=1)
        heading = np.arctan2(asteroids[rows, nearest_active, 0], asteroids[rows, nearest_active, 1])
        compass = THRUST + (np.round(heading / (np.pi / 4)).astype(np.int64) % 8)

        going_home = (hold >= 0.95) | (fuel < 0.3) | (hull < 0.35)
        near_station_fast = (target_dist < self.dock_range + 3.0 * speed) & (speed > self.dock_speed)
        near_ore_fast = (target_ore_dist < self.mine_range + 3.0 * speed) & (speed > self.safe_speed)

        conditions = [
            docked & mask[:, SELL_ALL],
            docked & (fuel < 0.9) & mask[:, FILL_FUEL],
            docked & (hull < 0.7) & mask[:, FULL_REPAIR],
            docked,
            going_home & mask[:, DOCK],
            going_home & near_station_fast & mask[:, BRAKE],
            going_home,
            mine_ok.any(axis=1),
            mask[:, WIDE_SCAN],
            any_known & near_ore_fast & mask[:, BRAKE],
            any_known & (target_ore_dist > self.mine_range * 0.5),
            scan_ok.any(axis=1),
            active.any(axis=1),
        ]
        choices = [
            SELL_ALL, FILL_FUEL, FULL_REPAIR, UNDOCK,
            DOCK, BRAKE, STEER_STATION + target_station,
            mine_choice, WIDE_SCAN,
            BRAKE, STEER_ORE + target_ore,
            scan_choice, compass,
        ]
        actions = np.select(conditions, choices, default=WAIT).astype(np.int32)
        # never send an action the mask calls invalid (it would only waste the step)
        valid = mask[rows, actions]
        return np.where(valid, actions, WAIT).astype(np.int32)


class MaskedRandom:
    """`random_policy` as an object for peregrine.evaluate: (seed=...), reset(env)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def reset(self, env) -> None:
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, observations):
        return random_policy(observations, self.rng)


class Trader(ScriptedTrader):
    """`ScriptedTrader` for peregrine.evaluate: built with (seed=...), bound to
    the env's config by reset(env). Deterministic; the seed is unused."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.seed = seed

    def reset(self, env) -> None:
        ScriptedTrader.__init__(self, **env.config)


#: name -> class(seed=...) with reset(env): the scripted policies peregrine.evaluate can run
POLICIES = {"random": MaskedRandom, "trader": Trader}


__all__ = ["random_policy", "ScriptedTrader", "MaskedRandom", "Trader", "POLICIES"]
