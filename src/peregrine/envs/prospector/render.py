"""Prospector frames for `render_mode="rgb_array"`: the belt seen from above.

Drawn with NumPy alone (peregrine.envs.raster) from one instance's exact state
(`env.get_state(instance)`, named by reference.STATE_INDEX), 400 x 400 for
the whole world_size square plus a strip of gauges:

- asteroids: discs coloured by ore (ice light blue, iron rust, cobalt blue,
  platinum silver), sized by the ore left, outlined once scanned, grey while
  depleted (waiting to respawn);
- stations: dark squares; storms: translucent red discs of their radius;
- the ship: a green triangle pointing along its velocity (yellow when docked);
- gauges along the bottom: fuel (orange) and hull (green) as fractions of
  their capacity, cargo per ore in the ore colours.
"""
from __future__ import annotations

import numpy as np

from ..raster import Canvas
from . import NUM_ASTEROIDS, NUM_ORES, NUM_STATIONS, NUM_STORMS
from .reference import STATE_INDEX

RENDER_FPS = 15
SIZE = 400
GAUGES = 24  # pixels of gauges below the world

BACKGROUND = (16, 18, 30)
ORE_COLOURS = ((170, 220, 245), (183, 90, 50), (60, 90, 220), (205, 205, 215))
DEPLETED = (70, 70, 75)
SCANNED = (255, 255, 255)
STATION = (150, 150, 160)
STORM = (230, 40, 40)
SHIP = (60, 220, 90)
DOCKED = (250, 220, 40)
FUEL = (245, 150, 30)
HULL = (60, 200, 80)
GAUGE_BACK = (45, 48, 60)


def rgb_frame(env, instance: int = 0) -> np.ndarray:
    """The instance's frame, RGB uint8 [424, 400, 3]."""
    state = env.get_state(instance)
    config = env.config

    def value(name):
        return float(state[STATE_INDEX[name]])

    world = float(config["world_size"])
    scale = SIZE / world
    canvas = Canvas(SIZE, SIZE + GAUGES, BACKGROUND)

    def at(x, y):  # world -> pixels, the world above the gauge strip
        return x * scale, GAUGES + y * scale

    for m in range(NUM_STORMS):
        canvas.circle(*at(value(f"storm_{m}_x"), value(f"storm_{m}_y")),
                      value(f"storm_{m}_radius") * scale, STORM, alpha=0.3)
    ore_max = max(float(config["ore_max"]), 1e-9)
    for a in range(NUM_ASTEROIDS):
        centre = at(value(f"asteroid_{a}_x"), value(f"asteroid_{a}_y"))
        depleted = value(f"asteroid_{a}_timer") > 0
        kind = int(value(f"asteroid_{a}_type")) % NUM_ORES
        radius = 3.0 + 5.0 * float(np.clip(value(f"asteroid_{a}_ore") / ore_max, 0.0, 1.0))
        if value(f"asteroid_{a}_scanned") > 0 and not depleted:
            canvas.circle(*centre, radius + 1.5, SCANNED)
        canvas.circle(*centre, radius, DEPLETED if depleted else ORE_COLOURS[kind])
    half = 5.0
    for j in range(NUM_STATIONS):
        x, y = at(value(f"station_{j}_x"), value(f"station_{j}_y"))
        canvas.rectangle(x - half, y - half, x + half, y + half, STATION)

    x, y = at(value("x"), value("y"))
    vx, vy = value("vx"), value("vy")
    heading = float(np.arctan2(vy, vx)) if vx or vy else np.pi / 2
    nose = np.array([np.cos(heading), np.sin(heading)])
    side = np.array([-nose[1], nose[0]])
    centre = np.array([x, y])
    canvas.polygon([centre + nose * 8, centre - nose * 5 + side * 5, centre - nose * 5 - side * 5],
                   DOCKED if value("docked") > 0 else SHIP)

    def gauge(left, width, fraction, colour):
        canvas.rectangle(left, 4, left + width, GAUGES - 4, GAUGE_BACK)
        canvas.rectangle(left, 4, left + width * float(np.clip(fraction, 0.0, 1.0)),
                         GAUGES - 4, colour)

    gauge(4, 120, value("fuel") / float(config["fuel_capacity"]), FUEL)
    gauge(132, 120, value("hull") / float(config["hull_max"]), HULL)
    cargo = np.array([value(f"cargo_{k}") for k in range(NUM_ORES)])
    total = max(float(cargo.sum()), 1e-9)
    left = 260.0
    for k in range(NUM_ORES):  # the hold's mix: each ore's share of 136 pixels
        width = 136.0 * cargo[k] / total if cargo.sum() > 0 else 0.0
        if width > 0:
            canvas.rectangle(left, 4, left + width, GAUGES - 4, ORE_COLOURS[k])
        left += width
    return canvas.pixels
