"""MountainCarContinuous-v0 as a native batch: Gymnasium's rules, thousands of instances per call.

Observation (2 float32): position in [-1.2, 0.6], velocity in [-0.07, 0.07].
Action: Box(-1, 1, (1,)) float32, the engine force; the same space as
Gymnasium's and as every continuous native env. Actions beyond +-1 are
clipped for the dynamics but, as in Gymnasium, the action cost
0.1 * action^2 is charged on the action as given (saturating at |action| =
1e6 so the reward stays finite); NaN/inf count as 0. Reward: 100 on reaching
the goal (position >= 0.45 with velocity >= 0, terminal) minus the action
cost on every step. Truncated after 999 steps. Reset: position uniform in
[-0.6, -0.4), velocity 0. Episode statistics: episode_return,
episode_length, success (1 when the episode reached the goal, else 0).

Config: max_steps, goal_position, goal_velocity (Gymnasium's
`goal_velocity`), power, gravity, max_speed, goal_reward, action_cost. See
mountain_car_continuous.h for the C core and reference.py for the NumPy
version of the same rules.
"""
from __future__ import annotations

import numpy as np

from ..native.batch import NativeEnv
from . import _mountain_car_continuous

MIN_POSITION, MAX_POSITION = -1.2, 0.6


class MountainCarContinuous(NativeEnv):
    name = "mountain_car_continuous"
    native_module = _mountain_car_continuous

    def observation_bounds(self):
        speed = self.config["max_speed"]
        return np.array([MIN_POSITION, -speed]), np.array([MAX_POSITION, speed])
