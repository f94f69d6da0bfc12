"""Pendulum-v1 as a native batch: Gymnasium's swing-up rules, thousands of instances per call.

Observation (3 float32): cos(angle), sin(angle), angular velocity, in
[-1, 1] x [-1, 1] x [-8, 8]. Action: Box(-2, 2, (1,)) float32, the torque
itself, exactly Gymnasium's action space (not the generic Box(-1, 1) of
continuous native envs): a policy's output maps to torque with no rescaling,
values beyond +-2 are clipped, NaN/inf count as 0. Reward
-(angle^2 + 0.1 angular_velocity^2 + 0.001 torque^2) of the state the action
was taken in, angle normalised to [-pi, pi]. Never terminal; truncated after
200 steps. Episode statistics: episode_return, episode_length.

Config: max_steps, gravity (Gymnasium's `g`), mass, length, dt, max_speed,
max_torque; the spaces follow max_speed and max_torque. See pendulum.h for the
C core and reference.py for the NumPy version of the same rules.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from ..native.batch import NativeEnv
from . import _pendulum


class Pendulum(NativeEnv):
    name = "pendulum"
    native_module = _pendulum

    def observation_bounds(self):
        speed = self.config["max_speed"]
        return np.array([-1.0, -1.0, -speed]), np.array([1.0, 1.0, speed])

    def make_action_space(self, dims):
        # Gymnasium's space: the action is the torque in [-max_torque, max_torque].
        torque = np.float32(self.config["max_torque"])
        return spaces.Box(-torque, torque, (dims["action_dim"],), np.float32)
