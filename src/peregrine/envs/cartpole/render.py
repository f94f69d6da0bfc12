"""CartPole frames for `render_mode="rgb_array"`: the cart on its track and the pole.

Drawn with NumPy alone (peregrine.envs.raster) from one instance's exact state
(`env.get_state(instance)`: x, x_dot, theta, theta_dot, steps), at Gymnasium's
CartPole size (600 x 400) and scale: the track spans +-x_threshold, the pole
is 2 * length long.
"""
from __future__ import annotations

import numpy as np

from ..raster import Canvas

RENDER_FPS = 50  # Gymnasium's CartPole-v1 (one step is tau = 0.02 s)
WIDTH, HEIGHT = 600, 400

BACKGROUND = (255, 255, 255)
TRACK = (0, 0, 0)
CART = (0, 0, 0)
POLE = (202, 152, 101)
AXLE = (129, 132, 203)


def rgb_frame(env, instance: int = 0) -> np.ndarray:
    """The instance's frame, RGB uint8 [400, 600, 3]."""
    x, _x_dot, theta = env.get_state(instance)[:3]
    config = env.config
    scale = WIDTH / (2.0 * float(config["x_threshold"]))
    canvas = Canvas(WIDTH, HEIGHT, BACKGROUND)
    track_y = 100.0
    canvas.rectangle(0, track_y - 0.5, WIDTH, track_y + 0.5, TRACK)
    cart_x = float(x) * scale + WIDTH / 2.0
    cart_width, cart_height = 50.0, 30.0
    canvas.rectangle(cart_x - cart_width / 2, track_y - cart_height / 2,
                     cart_x + cart_width / 2, track_y + cart_height / 2, CART)
    axle = (cart_x, track_y + cart_height / 4)
    # theta is measured from upright, positive to the right (clockwise)
    canvas.rotated_rectangle(axle, scale * 2.0 * float(config["length"]), 10.0,
                             np.pi / 2 - float(theta), POLE)
    canvas.circle(*axle, 5.0, AXLE)
    return canvas.pixels
