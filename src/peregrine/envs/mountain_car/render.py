"""MountainCar frames for `render_mode="rgb_array"` (MountainCar and
MountainCarContinuous: the same valley, car and flag).

Drawn with NumPy alone (peregrine.envs.raster) from one instance's exact state
(`env.get_state(instance)`: position, velocity, steps, return), at
Gymnasium's size (600 x 400): the hill height(x) = 0.45 sin(3x) + 0.55 over
[-1.2, 0.6], the car tilted with the slope, the flag at goal_position.
"""
from __future__ import annotations

import functools

import numpy as np

from ..raster import Canvas
from . import MAX_POSITION, MIN_POSITION

RENDER_FPS = 30  # Gymnasium's MountainCar-v0 / MountainCarContinuous-v0
WIDTH, HEIGHT = 600, 400

BACKGROUND = (255, 255, 255)
HILL = (215, 215, 205)
CAR = (40, 40, 40)
WHEEL = (128, 128, 128)
FLAG = (204, 204, 0)
POLE = (60, 60, 60)


def _height(position):
    return np.sin(3.0 * np.asarray(position, np.float64)) * 0.45 + 0.55


SCALE = WIDTH / (MAX_POSITION - MIN_POSITION)


@functools.lru_cache(maxsize=8)
def _scenery(goal: float) -> np.ndarray:
    """The hill and the flag at `goal`, drawn once (read-only; frames copy it)."""
    canvas = Canvas(WIDTH, HEIGHT, BACKGROUND)
    columns = MIN_POSITION + (np.arange(WIDTH) + 0.5) / SCALE
    canvas.fill_below(_height(columns) * SCALE, HILL)
    flag_x, flag_y = (goal - MIN_POSITION) * SCALE, float(_height(goal)) * SCALE
    canvas.rectangle(flag_x - 1, flag_y, flag_x + 1, flag_y + 50, POLE)
    canvas.polygon([(flag_x, flag_y + 50), (flag_x, flag_y + 40), (flag_x + 25, flag_y + 45)],
                   FLAG)
    canvas.pixels.flags.writeable = False
    return canvas.pixels


def rgb_frame(env, instance: int = 0) -> np.ndarray:
    """The instance's frame, RGB uint8 [400, 600, 3]."""
    position = float(env.get_state(instance)[0])
    scale = SCALE
    canvas = Canvas.wrap(_scenery(float(env.config["goal_position"])).copy())

    slope = float(np.arctan(1.35 * np.cos(3.0 * position)))  # d height / d position
    base = np.array([(position - MIN_POSITION) * scale, float(_height(position)) * scale])
    along, up = np.array([np.cos(slope), np.sin(slope)]), np.array([-np.sin(slope), np.cos(slope)])
    clearance, car_width, car_height = 10.0, 40.0, 20.0
    bottom = base + up * clearance
    corners = [bottom - along * car_width / 2, bottom + along * car_width / 2,
               bottom + along * car_width / 2 + up * car_height,
               bottom - along * car_width / 2 + up * car_height]
    canvas.polygon(corners, CAR)
    for offset in (-car_width / 4, car_width / 4):
        wheel = base + up * clearance + along * offset
        canvas.circle(*wheel, car_height / 2.5, WHEEL)
    return canvas.pixels
