"""CartPole-v1 as a native batch: Gymnasium's rules, thousands of instances per call.

Observation (4 float32): cart position, cart velocity, pole angle, pole angular
velocity. Action: Discrete(2), 0 pushes left, 1 pushes right. Reward 1 per
step (including the terminating one). Terminal when |x| > 2.4 or |angle| > 12
degrees; truncated after 500 steps. Episode statistics: episode_return,
episode_length. See cartpole.h for the C core and reference.py for the NumPy
version of the same rules.
"""
from __future__ import annotations

import numpy as np

from ..native.batch import NativeEnv
from . import _cartpole


class CartPole(NativeEnv):
    name = "cartpole"
    native_module = _cartpole

    def observation_bounds(self):
        # Gymnasium's CartPole-v1 observation space: the velocities are unbounded.
        x2, theta2 = 2 * self.config["x_threshold"], 2 * self.config["theta_threshold"]
        return (np.array([-x2, -np.inf, -theta2, -np.inf]),
                np.array([x2, np.inf, theta2, np.inf]))
