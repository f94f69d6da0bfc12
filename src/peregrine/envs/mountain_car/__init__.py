"""MountainCar-v0 as a native batch: Gymnasium's rules, thousands of instances per call.

Observation (2 float32): position in [-1.2, 0.6], velocity in [-0.07, 0.07].
Action: Discrete(3), 0 accelerates left, 1 does nothing, 2 accelerates right.
Reward -1 on every step. Terminal when the car reaches position >= 0.5 with
velocity >= 0; truncated after 200 steps. Reset: position uniform in
[-0.6, -0.4), velocity 0. Episode statistics: episode_return, episode_length,
success (1 when the episode reached the goal, else 0).

Config: max_steps, goal_position, goal_velocity (Gymnasium's
`goal_velocity`), force, gravity, max_speed. See mountain_car.h for the C
core and reference.py for the NumPy version of the same rules.
"""
from __future__ import annotations

import numpy as np

from ..native.batch import NativeEnv
from . import _mountain_car

MIN_POSITION, MAX_POSITION = -1.2, 0.6


class MountainCar(NativeEnv):
    name = "mountain_car"
    native_module = _mountain_car

    def observation_bounds(self):
        speed = self.config["max_speed"]
        return np.array([MIN_POSITION, -speed]), np.array([MAX_POSITION, speed])
