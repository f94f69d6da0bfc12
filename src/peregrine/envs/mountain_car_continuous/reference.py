"""MountainCarContinuous in NumPy: the readable reference for mountain_car_continuous.h.

The track, the move rule and the episode bookkeeping are MountainCar's
(mountain_car/reference.py); this variant adds its force (a continuous push,
clipped) and its reward (goal bonus minus an action cost), in the same
float32 order as the C loop.
"""
from __future__ import annotations

import numpy as np

from ..mountain_car.reference import MountainCarReference, cos3
from . import MountainCarContinuous

f32 = np.float32
MAX_ACTION_SQUARED = f32(1e12)  # the action cost saturates here so rewards stay finite


class MountainCarContinuousReference(MountainCarReference):
    """Batch of MountainCarContinuous instances with NativeEnv's reset/step contract."""

    env_class = MountainCarContinuous

    def configure(self, c):
        self.power = f32(c["power"])
        self.goal_reward, self.action_cost = f32(c["goal_reward"]), f32(c["action_cost"])

    def acceleration(self, actions):
        action = np.asarray(actions, np.float32).reshape(self.num_envs)
        action = np.where(np.isfinite(action), action, f32(0))
        # clip(action, -1, 1) * power, computed as clip(action * power, -power, power):
        # the same float32 value, in the order the C loop uses
        push = np.clip(action * self.power, -self.power, self.power)
        action_squared = np.minimum(action * action, MAX_ACTION_SQUARED)  # unclipped, as Gymnasium
        return push - self.gravity * cos3(self.position), action_squared

    def rewards(self, terminals, action_squared):
        return (np.where(terminals, self.goal_reward, f32(0))
                - action_squared * self.action_cost).astype(np.float32)
