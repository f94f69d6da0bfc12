"""Prospector in plain Python: the readable reference for prospector.h.

One `Game` per instance, written for clarity: the rules read as in
docs/prospector.md. Every quantity is an np.float32 scalar and every
expression keeps the C operation order, and the random numbers come from the
same splitmix64 streams (peregrine/envs/reference/rng.py) in the same order, so for one
seed and one action sequence this produces the C batch's observations,
rewards and flags (the parity tests allow 1e-5, and in practice they are
bit-identical).

Random draws per instance, in order:
  reset: for each station: x, y, 4 ore price multipliers, fuel multiplier,
         repair multiplier; for each asteroid: x, y, ore type, ore amount;
         for each storm: x, y, vx, vy, radius; then the home station (randint 4).
  step:  each asteroid that respawns this step (index order): x, y, type,
         amount; then one 64-bit draw per station for the market (ore k uses
         bits 16k..16k+15 as a noise in [-1, 1)).

It is slow (0.1-0.3 ms per instance step) and meant for tests and
for reading, not for training.
"""
from __future__ import annotations

import numpy as np

from ..reference.rng import Streams
from . import (ASTEROID_FEATURES, BOOST, BRAKE, BUY_FUEL, DOCK, FILL_FUEL, FULL_REPAIR,
               JETTISON, MINE, NUM_ACTIONS, NUM_ASTEROIDS, NUM_ORES, NUM_STATIONS, NUM_STORMS,
               OBS_DIM, REPAIR, SCAN, SELL, SELL_ALL, STATION_FEATURES, STEER_ORE,
               STEER_STATION, STORM_FEATURES, THRUST, UNDOCK, UPGRADE, WAIT, WIDE_SCAN,
               Prospector)

f32 = np.float32
MAX_LEVEL = 3
ORE_CUMULATIVE = (f32(0.4), f32(0.7), f32(0.9))
DIAG = f32(0.70710677)
DIR_X = (f32(0), DIAG, f32(1), DIAG, f32(0), -DIAG, f32(-1), -DIAG)  # N NE E SE S SW W NW
DIR_Y = (f32(1), DIAG, f32(0), -DIAG, f32(-1), -DIAG, f32(0), DIAG)
CREDIT_OBS_SCALE = f32(0.001)
LEVEL_OBS_SCALE = f32(0.33333334)
STEER_MIN_DIST2 = f32(1e-6)
NO_ASTEROID_DISTANCE = f32(2.0)
NOISE_SCALE = f32(2.0 ** -15)

OBS_ASTEROIDS, OBS_STATIONS, OBS_STORMS = 24, 132, 168
OBS_BEST_PRICE, OBS_NEAREST_ORE, OBS_MASK = 183, 187, 191

# The flat float64 state (env_get_state / env_set_state), in order.
STATE_LAYOUT = (
    ["x", "y", "vx", "vy", "fuel", "hull", "credits"]
    + [f"cargo_{k}" for k in range(NUM_ORES)]
    + ["docked", "hold_level", "drill_level", "shield_level", "steps", "last_invalid"]
    + ["episode_return", "ore_mined", "ore_sold", "invalid_actions", "upgrades"]
    + [f"asteroid_{i}_{f}" for i in range(NUM_ASTEROIDS)
       for f in ("x", "y", "ore", "type", "scanned", "timer")]
    + [f"station_{j}_{f}" for j in range(NUM_STATIONS)
       for f in ["x", "y", "fuel_price", "repair_price"]
       + [f"base_{k}" for k in range(NUM_ORES)] + [f"price_{k}" for k in range(NUM_ORES)]]
    + [f"storm_{m}_{f}" for m in range(NUM_STORMS) for f in ("x", "y", "vx", "vy", "radius")]
)
STATE_INDEX = {name: index for index, name in enumerate(STATE_LAYOUT)}
STATE_SIZE = len(STATE_LAYOUT)  # 157


def inverse(value):
    return f32(1) / value if value > f32(0) else f32(0)


def clamp(x, low, high):
    return low if x < low else (high if x > high else x)


class Rules:
    """The config as float32 constants, derived exactly as env_init does."""

    def __init__(self, config: dict):
        c = {name: f32(value) for name, value in config.items()}
        self.max_steps, self.respawn_delay = int(config["max_steps"]), int(config["respawn_delay"])
        self.world = c["world_size"]
        for name in ("start_credits", "fuel_capacity", "hull_max", "thrust_accel", "max_speed",
                     "drag", "brake_factor", "thrust_fuel", "boost_fuel", "idle_fuel",
                     "scan_fuel", "wide_scan_fuel", "mine_fuel", "collision_damage",
                     "storm_damage", "storm_radius_min", "storm_radius_max", "storm_speed",
                     "hold_base", "hold_step", "drill_base", "drill_step", "shield_step",
                     "upgrade_cost", "ore_min", "ore_max", "station_spread", "price_reversion",
                     "price_volatility", "sale_impact", "fuel_price", "repair_price",
                     "reward_scale", "death_penalty", "cargo_shaping"):
            setattr(self, name, c[name])
        self.boost_accel = c["thrust_accel"] * c["boost_factor"]
        for name in ("scan_range", "wide_scan_range", "mine_range", "dock_range", "dock_speed",
                     "collision_radius", "safe_speed"):
            setattr(self, name + "2", c[name] * c[name])
        self.ore_price = [c["price_ice"], c["price_iron"], c["price_cobalt"], c["price_platinum"]]
        self.price_lo = [c["price_min_frac"] * p for p in self.ore_price]
        self.price_hi = [c["price_max_frac"] * p for p in self.ore_price]
        self.inv_ore_price = [inverse(p) for p in self.ore_price]
        max_capacity = self.hold_base + f32(MAX_LEVEL) * self.hold_step
        self.inv_world = inverse(self.world)
        self.inv_max_speed = inverse(self.max_speed)
        self.inv_fuel_capacity = inverse(self.fuel_capacity)
        self.inv_hull_max = inverse(self.hull_max)
        self.inv_max_capacity = inverse(max_capacity)
        self.inv_ore_max = inverse(self.ore_max)
        self.inv_fuel_price = inverse(self.fuel_price)
        self.inv_repair_price = inverse(self.repair_price)
        self.inv_storm_speed = inverse(self.storm_speed)
        self.inv_max_steps = inverse(f32(self.max_steps))


class Rng:
    """One instance's splitmix64 stream (a view on a shared Streams)."""

    def __init__(self, streams: Streams, instance: int):
        self.streams, self.index = streams, np.array([instance])

    def u64(self) -> int:
        return int(self.streams.next_u64(self.index)[0])

    def uniform(self):
        return f32(self.streams.uniform(self.index)[0])

    def uniform_range(self, low, high):
        width = high - low
        return low + self.uniform() * width

    def randint(self, n: int) -> int:
        return int(self.streams.randint(self.index, n)[0])


class Game:
    """One Prospector instance: state, reset, step, observation."""

    def __init__(self, rules: Rules, rng: Rng):
        self.rules, self.rng = rules, rng
        self.mask = np.zeros(NUM_ACTIONS, bool)
        self.nearest_ore = [-1] * NUM_ORES

    # ---- derived quantities --------------------------------------------------
    def capacity(self):
        return self.rules.hold_base + f32(self.hold_level) * self.rules.hold_step

    def drill_rate(self):
        return self.rules.drill_base + f32(self.drill_level) * self.rules.drill_step

    def shield_factor(self):
        return f32(1) - self.rules.shield_step * f32(self.shield_level)

    def cargo_total(self):
        return ((self.cargo[0] + self.cargo[1]) + self.cargo[2]) + self.cargo[3]

    def hold_value(self):
        """The hold at the ores' base prices (the optional shaping's potential)."""
        p = self.rules.ore_price
        return ((self.cargo[0] * p[0] + self.cargo[1] * p[1]) + self.cargo[2] * p[2]) \
            + self.cargo[3] * p[3]

    def upgrade_price(self, level):
        return self.rules.upgrade_cost * f32(level + 1)

    def distance2(self, x, y):
        dx, dy = x - self.x, y - self.y
        return dx * dx + dy * dy

    # ---- reset ---------------------------------------------------------------
    def spawn_asteroid(self, i):
        r, rng = self.rules, self.rng
        self.ast_x[i] = rng.uniform_range(f32(0), r.world)
        self.ast_y[i] = rng.uniform_range(f32(0), r.world)
        u = rng.uniform()
        ore_type = 0
        while ore_type < NUM_ORES - 1 and u >= ORE_CUMULATIVE[ore_type]:
            ore_type += 1
        self.ast_type[i] = ore_type
        self.ast_ore[i] = rng.uniform_range(r.ore_min, r.ore_max)
        self.ast_scanned[i] = 0
        self.ast_timer[i] = 0

    def reset(self):
        r, rng = self.rules, self.rng
        zeros = lambda n: [f32(0)] * n  # noqa: E731
        self.x = self.y = self.vx = self.vy = f32(0)
        self.cargo = zeros(NUM_ORES)
        self.hold_level = self.drill_level = self.shield_level = 0
        self.steps = self.last_invalid = 0
        self.episode_return = self.ore_mined = self.ore_sold = f32(0)
        self.invalid_actions = self.upgrades = 0
        self.ast_x, self.ast_y, self.ast_ore = zeros(12), zeros(12), zeros(12)
        self.ast_type, self.ast_scanned, self.ast_timer = [0] * 12, [0] * 12, [0] * 12
        self.st_x, self.st_y = zeros(NUM_STATIONS), zeros(NUM_STATIONS)
        self.st_fuel_price, self.st_repair_price = zeros(NUM_STATIONS), zeros(NUM_STATIONS)
        self.st_base = [zeros(NUM_ORES) for _ in range(NUM_STATIONS)]
        self.st_price = [zeros(NUM_ORES) for _ in range(NUM_STATIONS)]
        low, high = f32(0.1) * r.world, f32(0.9) * r.world
        mult_lo, mult_hi = f32(1) - r.station_spread, f32(1) + r.station_spread
        for j in range(NUM_STATIONS):
            self.st_x[j] = rng.uniform_range(low, high)
            self.st_y[j] = rng.uniform_range(low, high)
            for k in range(NUM_ORES):
                base = r.ore_price[k] * rng.uniform_range(mult_lo, mult_hi)
                self.st_base[j][k] = base
                self.st_price[j][k] = clamp(base, r.price_lo[k], r.price_hi[k])
            self.st_fuel_price[j] = r.fuel_price * rng.uniform_range(mult_lo, mult_hi)
            self.st_repair_price[j] = r.repair_price * rng.uniform_range(mult_lo, mult_hi)
        for i in range(NUM_ASTEROIDS):
            self.spawn_asteroid(i)
        self.storm_x, self.storm_y = zeros(NUM_STORMS), zeros(NUM_STORMS)
        self.storm_vx, self.storm_vy, self.storm_r = zeros(NUM_STORMS), zeros(NUM_STORMS), zeros(NUM_STORMS)
        for m in range(NUM_STORMS):
            self.storm_x[m] = rng.uniform_range(f32(0), r.world)
            self.storm_y[m] = rng.uniform_range(f32(0), r.world)
            self.storm_vx[m] = rng.uniform_range(-r.storm_speed, r.storm_speed)
            self.storm_vy[m] = rng.uniform_range(-r.storm_speed, r.storm_speed)
            self.storm_r[m] = rng.uniform_range(r.storm_radius_min, r.storm_radius_max)
        home = rng.randint(NUM_STATIONS)
        self.x, self.y = self.st_x[home], self.st_y[home]
        self.docked = home + 1
        self.fuel, self.hull, self.credits = r.fuel_capacity, r.hull_max, r.start_credits
        return self.observe()

    # ---- observation and mask ----------------------------------------------------
    def observe(self) -> np.ndarray:
        """The 260 floats; also refreshes self.mask and self.nearest_ore."""
        r = self.rules
        row = np.zeros(OBS_DIM, np.float32)
        mask = np.zeros(NUM_ACTIONS, bool)
        docked = self.docked != 0
        flying = not docked
        capacity, total = self.capacity(), self.cargo_total()
        inv_world = r.inv_world
        # ship
        row[0], row[1] = self.x * inv_world, self.y * inv_world
        row[2], row[3] = self.vx * r.inv_max_speed, self.vy * r.inv_max_speed
        row[4] = self.fuel * r.inv_fuel_capacity
        row[5] = self.hull * r.inv_hull_max
        row[6] = total / capacity
        row[7] = capacity * r.inv_max_capacity
        for k in range(NUM_ORES):
            row[8 + k] = self.cargo[k] / capacity
        row[12] = self.credits * CREDIT_OBS_SCALE
        row[13] = docked
        for j in range(NUM_STATIONS):
            row[14 + j] = self.docked == j + 1
        row[18] = f32(self.hold_level) * LEVEL_OBS_SCALE
        row[19] = f32(self.drill_level) * LEVEL_OBS_SCALE
        row[20] = f32(self.shield_level) * LEVEL_OBS_SCALE
        row[21] = f32(r.max_steps - self.steps) * r.inv_max_steps
        row[23] = self.last_invalid
        # asteroids
        nearest, nearest_d2 = [-1] * NUM_ORES, [f32(0)] * NUM_ORES
        can_mine = flying and total < capacity and self.drill_rate() > f32(0)
        for i in range(NUM_ASTEROIDS):
            base = OBS_ASTEROIDS + ASTEROID_FEATURES * i
            dx, dy = self.ast_x[i] - self.x, self.ast_y[i] - self.y
            d2 = dx * dx + dy * dy
            active = self.ast_timer[i] == 0
            known = active and self.ast_scanned[i] != 0
            row[base + 0], row[base + 1] = dx * inv_world, dy * inv_world
            row[base + 2], row[base + 3] = active, known
            if known:
                row[base + 4] = self.ast_ore[i] * r.inv_ore_max
                row[base + 5 + self.ast_type[i]] = 1
            mask[SCAN + i] = flying and active and not known and d2 <= r.scan_range2
            mask[MINE + i] = can_mine and known and d2 <= r.mine_range2
            if flying and active and not known and d2 <= r.wide_scan_range2:
                mask[WIDE_SCAN] = True
            t = self.ast_type[i]
            if known and (nearest[t] < 0 or d2 < nearest_d2[t]):
                nearest[t], nearest_d2[t] = i, d2
        # stations
        speed2 = self.vx * self.vx + self.vy * self.vy
        best_price = [f32(0)] * NUM_ORES
        for j in range(NUM_STATIONS):
            base = OBS_STATIONS + STATION_FEATURES * j
            dx, dy = self.st_x[j] - self.x, self.st_y[j] - self.y
            d2 = dx * dx + dy * dy
            in_range = d2 <= r.dock_range2
            if flying and in_range and speed2 <= r.dock_speed2:
                mask[DOCK] = True
            row[base + 0], row[base + 1], row[base + 2] = dx * inv_world, dy * inv_world, in_range
            for k in range(NUM_ORES):
                price = self.st_price[j][k]
                row[base + 3 + k] = price * r.inv_ore_price[k]
                if price > best_price[k]:
                    best_price[k] = price
            row[base + 7] = self.st_fuel_price[j] * r.inv_fuel_price
            row[base + 8] = self.st_repair_price[j] * r.inv_repair_price
            mask[STEER_STATION + j] = flying and d2 > STEER_MIN_DIST2
        # storms
        in_storm = False
        for m in range(NUM_STORMS):
            base = OBS_STORMS + STORM_FEATURES * m
            dx, dy = self.storm_x[m] - self.x, self.storm_y[m] - self.y
            if dx * dx + dy * dy < self.storm_r[m] * self.storm_r[m]:
                in_storm = True
            row[base + 0], row[base + 1] = dx * inv_world, dy * inv_world
            row[base + 2] = self.storm_r[m] * inv_world
            row[base + 3] = self.storm_vx[m] * r.inv_storm_speed
            row[base + 4] = self.storm_vy[m] * r.inv_storm_speed
        row[22] = in_storm
        # market summary, nearest known asteroid per ore
        for k in range(NUM_ORES):
            row[OBS_BEST_PRICE + k] = best_price[k] * r.inv_ore_price[k]
            row[OBS_NEAREST_ORE + k] = (NO_ASTEROID_DISTANCE if nearest[k] < 0
                                        else np.sqrt(nearest_d2[k]) * inv_world)
            mask[STEER_ORE + k] = flying and nearest[k] >= 0 and nearest_d2[k] > STEER_MIN_DIST2
        self.nearest_ore = nearest
        # the rest of the mask
        mask[WAIT] = True
        mask[THRUST:THRUST + 8] = flying
        mask[BOOST:BOOST + 8] = flying
        mask[BRAKE] = flying and (self.vx != 0 or self.vy != 0)
        mask[UNDOCK] = docked
        for k in range(NUM_ORES):
            mask[SELL + k] = docked and self.cargo[k] > 0
            mask[JETTISON + k] = flying and self.cargo[k] > 0
        mask[SELL_ALL] = docked and total > 0
        if docked:
            j = self.docked - 1
            fuel_ok = self.fuel < r.fuel_capacity and (self.st_fuel_price[j] == 0 or self.credits > 0)
            repair_ok = self.hull < r.hull_max and (self.st_repair_price[j] == 0 or self.credits > 0)
            mask[BUY_FUEL] = mask[FILL_FUEL] = fuel_ok
            mask[REPAIR] = mask[FULL_REPAIR] = repair_ok
            for u, level in enumerate((self.hold_level, self.drill_level, self.shield_level)):
                mask[UPGRADE + u] = level < MAX_LEVEL and self.credits >= self.upgrade_price(level)
        row[OBS_MASK:] = mask
        self.mask = mask
        return row

    # ---- the step ----------------------------------------------------------------
    def push(self, accel, dir_x, dir_y):
        r = self.rules
        self.vx = clamp(self.vx + accel * dir_x, -r.max_speed, r.max_speed)
        self.vy = clamp(self.vy + accel * dir_y, -r.max_speed, r.max_speed)

    def steer(self, target_x, target_y):
        dx, dy = target_x - self.x, target_y - self.y
        dist = np.sqrt(dx * dx + dy * dy)
        self.push(self.rules.thrust_accel, dx / dist, dy / dist)
        self.fuel -= self.rules.thrust_fuel

    def sell(self, k):
        r, j = self.rules, self.docked - 1
        units, price = self.cargo[k], self.st_price[j][k]
        self.credits += units * price
        self.ore_sold += units
        self.cargo[k] = f32(0)
        impact = f32(1) - r.sale_impact * units
        self.st_price[j][k] = clamp(price * impact, r.price_lo[k], r.price_hi[k])

    def buy(self, wanted, price):
        amount = wanted
        if price > f32(0):
            affordable = self.credits / price
            if affordable < amount:
                amount = affordable
        self.credits = self.credits - amount * price
        if self.credits < f32(0):
            self.credits = f32(0)
        return amount

    def apply_action(self, a):
        r = self.rules
        if THRUST <= a < BOOST:
            self.push(r.thrust_accel, DIR_X[a - THRUST], DIR_Y[a - THRUST])
            self.fuel -= r.thrust_fuel
        elif BOOST <= a < BRAKE:
            self.push(r.boost_accel, DIR_X[a - BOOST], DIR_Y[a - BOOST])
            self.fuel -= r.boost_fuel
        elif a == BRAKE:
            self.vx *= r.brake_factor
            self.vy *= r.brake_factor
            self.fuel -= r.thrust_fuel
        elif a == WIDE_SCAN:
            for i in range(NUM_ASTEROIDS):
                if self.ast_timer[i] == 0 and self.distance2(self.ast_x[i], self.ast_y[i]) <= r.wide_scan_range2:
                    self.ast_scanned[i] = 1
            self.fuel -= r.wide_scan_fuel
        elif SCAN <= a < MINE:
            self.ast_scanned[a - SCAN] = 1
            self.fuel -= r.scan_fuel
        elif MINE <= a < DOCK:
            i = a - MINE
            amount = self.drill_rate()
            if self.ast_ore[i] < amount:
                amount = self.ast_ore[i]
            space = self.capacity() - self.cargo_total()
            if space < amount:
                amount = space
            self.ast_ore[i] -= amount
            self.cargo[self.ast_type[i]] += amount
            self.ore_mined += amount
            self.fuel -= r.mine_fuel
            if self.ast_ore[i] <= f32(0):  # depleted: gone until it respawns
                self.ast_ore[i] = f32(0)
                self.ast_timer[i] = r.respawn_delay
                self.ast_scanned[i] = 0
        elif a == DOCK:
            for j in range(NUM_STATIONS):
                if self.distance2(self.st_x[j], self.st_y[j]) <= r.dock_range2:
                    self.docked = j + 1
                    break
            self.vx = self.vy = f32(0)
        elif a == UNDOCK:
            self.docked = 0
        elif SELL <= a < SELL_ALL:
            self.sell(a - SELL)
        elif a == SELL_ALL:
            for k in range(NUM_ORES):
                if self.cargo[k] > 0:
                    self.sell(k)
        elif a in (BUY_FUEL, FILL_FUEL):
            missing, quarter = r.fuel_capacity - self.fuel, f32(0.25) * r.fuel_capacity
            wanted = quarter if (a == BUY_FUEL and quarter < missing) else missing
            self.fuel += self.buy(wanted, self.st_fuel_price[self.docked - 1])
            self.fuel = min(self.fuel, r.fuel_capacity)
        elif a in (REPAIR, FULL_REPAIR):
            missing, quarter = r.hull_max - self.hull, f32(0.25) * r.hull_max
            wanted = quarter if (a == REPAIR and quarter < missing) else missing
            self.hull += self.buy(wanted, self.st_repair_price[self.docked - 1])
            self.hull = min(self.hull, r.hull_max)
        elif JETTISON <= a < UPGRADE:
            self.cargo[a - JETTISON] = f32(0)
        elif UPGRADE <= a < STEER_STATION:
            name = ("hold_level", "drill_level", "shield_level")[a - UPGRADE]
            level = getattr(self, name)
            self.credits -= self.upgrade_price(level)
            setattr(self, name, level + 1)
            self.upgrades += 1
        elif STEER_STATION <= a < STEER_ORE:
            j = a - STEER_STATION
            self.steer(self.st_x[j], self.st_y[j])
        elif STEER_ORE <= a < NUM_ACTIONS:
            i = self.nearest_ore[a - STEER_ORE]
            self.steer(self.ast_x[i], self.ast_y[i])
        # WAIT: nothing

    def move_storm_axis(self, pos, vel):
        pos = pos + vel
        if pos < f32(0):
            return f32(0), abs(vel)
        if pos > self.rules.world:
            return self.rules.world, -abs(vel)
        return pos, vel

    def step(self, action: int):
        """Returns (reward, terminal, truncated); the caller observes/resets."""
        r = self.rules
        credits_before, hold_before = self.credits, self.hold_value()
        # 1. the action; an invalid one is a no-op, the same as wait
        if not self.mask[action]:
            action = WAIT
            self.last_invalid = 1
            self.invalid_actions += 1
        else:
            self.last_invalid = 0
        self.apply_action(action)
        # 2. motion and life support, in flight only
        flying = self.docked == 0
        if flying:
            self.x += self.vx
            self.y += self.vy
            if self.x < 0:
                self.x, self.vx = f32(0), f32(0)
            if self.x > r.world:
                self.x, self.vx = r.world, f32(0)
            if self.y < 0:
                self.y, self.vy = f32(0), f32(0)
            if self.y > r.world:
                self.y, self.vy = r.world, f32(0)
            self.vx *= r.drag
            self.vy *= r.drag
            self.fuel -= r.idle_fuel
        # 3. storms drift and bounce off the walls
        for m in range(NUM_STORMS):
            self.storm_x[m], self.storm_vx[m] = self.move_storm_axis(self.storm_x[m], self.storm_vx[m])
            self.storm_y[m], self.storm_vy[m] = self.move_storm_axis(self.storm_y[m], self.storm_vy[m])
        # 4. hazards, in flight only
        if flying:
            shield = self.shield_factor()
            speed2 = self.vx * self.vx + self.vy * self.vy
            collided = any(self.ast_timer[i] == 0 and
                           self.distance2(self.ast_x[i], self.ast_y[i]) < r.collision_radius2
                           for i in range(NUM_ASTEROIDS))
            if collided and speed2 > r.safe_speed2:
                self.hull -= r.collision_damage * speed2 * shield
                self.vx *= f32(-0.5)
                self.vy *= f32(-0.5)
            for m in range(NUM_STORMS):
                if self.distance2(self.storm_x[m], self.storm_y[m]) < self.storm_r[m] * self.storm_r[m]:
                    self.hull -= r.storm_damage * shield
        # 5. depleted asteroids count down and respawn
        for i in range(NUM_ASTEROIDS):
            if self.ast_timer[i] > 0:
                self.ast_timer[i] -= 1
                if self.ast_timer[i] == 0:
                    self.spawn_asteroid(i)
        # 6. the market: bounded mean-reverting random walk
        for j in range(NUM_STATIONS):
            bits = self.rng.u64()
            for k in range(NUM_ORES):
                noise = f32(((bits >> (16 * k)) & 0xFFFF) - 32768) * NOISE_SCALE
                base, price = self.st_base[j][k], self.st_price[j][k]
                pull = r.price_reversion * (base - price)
                shock = (r.price_volatility * base) * noise
                self.st_price[j][k] = clamp((price + pull) + shock, r.price_lo[k], r.price_hi[k])
        # 7. the end
        destroyed = self.hull <= 0
        out_of_fuel = not destroyed and self.fuel <= 0
        self.hull = max(self.hull, f32(0))
        self.fuel = max(self.fuel, f32(0))
        self.steps += 1
        terminal = destroyed or out_of_fuel
        truncated = not terminal and self.steps >= r.max_steps
        reward = (self.credits - credits_before) * r.reward_scale
        # optional shaping: change in the hold's base value; a terminal state's is 0
        hold_after = f32(0) if terminal else self.hold_value()
        reward = reward + (r.cargo_shaping * r.reward_scale) * (hold_after - hold_before)
        if terminal:
            reward = reward - r.death_penalty
        self.episode_return += reward
        return reward, terminal, truncated

    def episode_stats(self) -> dict:
        return {"episode_return": float(self.episode_return), "episode_length": self.steps,
                "ore_mined": float(self.ore_mined), "ore_sold": float(self.ore_sold),
                "credits": float(self.credits), "destroyed": float(self.hull <= 0),
                "out_of_fuel": float(self.hull > 0 and self.fuel <= 0),
                "invalid_actions": self.invalid_actions, "upgrades": self.upgrades}

    # ---- flat state ----------------------------------------------------------------
    def get_state(self) -> np.ndarray:
        values = [self.x, self.y, self.vx, self.vy, self.fuel, self.hull, self.credits,
                  *self.cargo, self.docked, self.hold_level, self.drill_level,
                  self.shield_level, self.steps, self.last_invalid, self.episode_return,
                  self.ore_mined, self.ore_sold, self.invalid_actions, self.upgrades]
        for i in range(NUM_ASTEROIDS):
            values += [self.ast_x[i], self.ast_y[i], self.ast_ore[i], self.ast_type[i],
                       self.ast_scanned[i], self.ast_timer[i]]
        for j in range(NUM_STATIONS):
            values += [self.st_x[j], self.st_y[j], self.st_fuel_price[j], self.st_repair_price[j],
                       *self.st_base[j], *self.st_price[j]]
        for m in range(NUM_STORMS):
            values += [self.storm_x[m], self.storm_y[m], self.storm_vx[m], self.storm_vy[m],
                       self.storm_r[m]]
        return np.array(values, np.float64)

    def set_state(self, state) -> np.ndarray:
        """Loads a flat state (no range checks: the C side has them)."""
        v = [float(x) for x in state]
        if len(v) != STATE_SIZE:
            raise ValueError(f"state has {len(v)} values, expected {STATE_SIZE}")
        floats = lambda s: [f32(x) for x in s]  # noqa: E731
        self.x, self.y, self.vx, self.vy, self.fuel, self.hull, self.credits = floats(v[0:7])
        self.cargo = floats(v[7:11])
        (self.docked, self.hold_level, self.drill_level, self.shield_level, self.steps,
         self.last_invalid) = (int(x) for x in v[11:17])
        self.episode_return, self.ore_mined, self.ore_sold = floats(v[17:20])
        self.invalid_actions, self.upgrades = int(v[20]), int(v[21])
        a = np.array(v[22:94]).reshape(NUM_ASTEROIDS, 6)
        self.ast_x, self.ast_y, self.ast_ore = floats(a[:, 0]), floats(a[:, 1]), floats(a[:, 2])
        self.ast_type = [int(x) for x in a[:, 3]]
        self.ast_scanned = [int(x) for x in a[:, 4]]
        self.ast_timer = [int(x) for x in a[:, 5]]
        s = np.array(v[94:142]).reshape(NUM_STATIONS, 12)
        self.st_x, self.st_y = floats(s[:, 0]), floats(s[:, 1])
        self.st_fuel_price, self.st_repair_price = floats(s[:, 2]), floats(s[:, 3])
        self.st_base = [floats(s[j, 4:8]) for j in range(NUM_STATIONS)]
        self.st_price = [floats(s[j, 8:12]) for j in range(NUM_STATIONS)]
        w = np.array(v[142:157]).reshape(NUM_STORMS, 5)
        self.storm_x, self.storm_y = floats(w[:, 0]), floats(w[:, 1])
        self.storm_vx, self.storm_vy, self.storm_r = floats(w[:, 2]), floats(w[:, 3]), floats(w[:, 4])
        return self.observe()


class ProspectorReference:
    """A batch of reference games with NativeEnv's reset/step contract."""

    def __init__(self, num_envs: int = 1, seed: int = 0, **config):
        self.num_envs = self.num_agents = num_envs
        self.config = Prospector.resolve_config(config)
        self.rules = Rules(self.config)
        self.observations = np.zeros((num_envs, OBS_DIM), np.float32)
        self.final_observations = np.zeros((num_envs, OBS_DIM), np.float32)
        self.episodes: list[dict] = []
        self.reset(seed)

    def reset(self, seed=None):
        if seed is not None:
            self.streams = Streams(seed, self.num_envs)
            self.games = [Game(self.rules, Rng(self.streams, i)) for i in range(self.num_envs)]
        for i, game in enumerate(self.games):
            self.observations[i] = game.reset()
        return self.observations.copy(), {}

    def step(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(f"actions must be {self.num_envs} integers")
        if ((actions < 0) | (actions >= NUM_ACTIONS)).any():
            raise ValueError(f"actions must be in 0..{NUM_ACTIONS - 1}")
        rewards = np.zeros(self.num_envs, np.float32)
        terminals = np.zeros(self.num_envs, bool)
        truncations = np.zeros(self.num_envs, bool)
        for i, game in enumerate(self.games):
            rewards[i], terminals[i], truncations[i] = game.step(int(actions[i]))
            self.observations[i] = game.observe()
            if terminals[i] or truncations[i]:
                self.final_observations[i] = self.observations[i]
                self.episodes.append(game.episode_stats())
                self.observations[i] = game.reset()
        return self.observations.copy(), rewards, terminals, truncations, {}

    def get_state(self, instance: int) -> np.ndarray:
        return self.games[instance].get_state()

    def set_state(self, instance: int, state) -> None:
        self.observations[instance] = self.games[instance].set_state(state)
