"""Pendulum frames for `render_mode="rgb_array"`: the rod seen from the front.

Drawn with NumPy alone (peregrine.envs.raster) from one instance's exact state
(`env.get_state(instance)`: theta, theta_dot, steps, return), at Gymnasium's
size (500 x 500): theta = 0 is upright, the rod is `length` long. The last
torque applied (the instance's row of `env.actions`) is the bar along the
bottom edge, to the right for positive (anticlockwise) torque, full width at
max_torque.
"""
from __future__ import annotations

import numpy as np

from ..raster import Canvas

RENDER_FPS = 30  # Gymnasium's Pendulum-v1
SIZE = 500

BACKGROUND = (255, 255, 255)
ROD = (204, 77, 77)
AXLE = (0, 0, 0)
TORQUE = (90, 90, 200)


def rgb_frame(env, instance: int = 0) -> np.ndarray:
    """The instance's frame, RGB uint8 [500, 500, 3]."""
    theta = float(env.get_state(instance)[0])
    length = float(env.config["length"])
    bound = 1.1 * length + 0.1
    scale = SIZE / (2.0 * bound)
    centre = (SIZE / 2.0, SIZE / 2.0)
    canvas = Canvas(SIZE, SIZE, BACKGROUND)
    rod_width = 0.2 * scale
    angle = theta + np.pi / 2  # upright at theta = 0, anticlockwise positive
    canvas.rotated_rectangle(centre, length * scale, rod_width, angle, ROD)
    tip = (centre[0] + np.cos(angle) * length * scale, centre[1] + np.sin(angle) * length * scale)
    canvas.circle(*tip, rod_width / 2, ROD)
    canvas.circle(*centre, rod_width / 2, ROD)
    canvas.circle(*centre, 0.05 * scale, AXLE)
    max_torque = float(env.config["max_torque"])
    torque = float(np.asarray(env.actions)[instance].ravel()[0]) if max_torque > 0 else 0.0
    if np.isfinite(torque) and max_torque > 0:
        reach = float(np.clip(torque / max_torque, -1.0, 1.0)) * SIZE / 2.0
        canvas.rectangle(min(SIZE / 2.0, SIZE / 2.0 + reach), 4, max(SIZE / 2.0, SIZE / 2.0 + reach),
                         14, TORQUE)
    return canvas.pixels
