"""Pendulum in NumPy: the readable reference for pendulum.h.

The same rules, in the same float32 operation order, drawing from the same
splitmix64 streams and using the same sincos, so that for one seed and one
action sequence it produces the C batch's observations bit for bit.
"""
from __future__ import annotations

import numpy as np

from ..reference.pg_math import sincos
from ..reference.batch import ReferenceBatch
from . import Pendulum

f32 = np.float32
_MAGIC = f32(12582912.0)  # 1.5 * 2^23: x + M - M rounds to the nearest integer
_TWO_PI_HI, _TWO_PI_LO = f32(6.28125), f32(1.9353071795864769e-3)
_INV_TWO_PI = f32(0.159154943091895336)
_PI = f32(3.14159265358979)


def wrap_angle(angle: np.ndarray) -> np.ndarray:
    """angle - 2 pi round(angle / 2 pi), as pendulum_wrap_angle in C."""
    k = (angle * _INV_TWO_PI + _MAGIC) - _MAGIC
    return (angle - k * _TWO_PI_HI) - k * _TWO_PI_LO


class PendulumReference(ReferenceBatch):
    """Batch of Pendulum instances with NativeEnv's reset/step contract."""

    env_class = Pendulum
    obs_dim = 3

    def setup(self, c):
        # derived constants rounded once from float64, as env_init does
        self.gravity_term = f32(3.0 * c["gravity"] / (2.0 * c["length"]))
        self.torque_term = f32(3.0 / (c["mass"] * c["length"] * c["length"]))
        self.dt, self.max_speed = f32(c["dt"]), f32(c["max_speed"])
        self.max_torque = f32(c["max_torque"])
        self.theta = np.zeros(self.num_envs, np.float32)
        self.theta_dot = np.zeros(self.num_envs, np.float32)

    def observations(self) -> np.ndarray:
        sin, cos = sincos(self.theta)
        return np.stack([cos, sin, self.theta_dot], axis=1).astype(np.float32)

    def _reset_instances(self, idx):
        self.theta[idx] = self.streams.uniform_range(idx, -_PI, _PI)  # draw order: angle,
        self.theta_dot[idx] = self.streams.uniform_range(idx, -1.0, 1.0)  # then velocity
        self.returns[idx] = 0
        self.steps[idx] = 0

    def step(self, actions):
        torque = np.asarray(actions, np.float32).reshape(self.num_envs)
        torque = np.where(np.isfinite(torque), torque, f32(0))
        torque = np.clip(torque, -self.max_torque, self.max_torque)
        theta, theta_dot = self.theta, self.theta_dot
        cost = theta * theta + f32(0.1) * (theta_dot * theta_dot) + f32(0.001) * (torque * torque)
        sin, cos = sincos(theta)
        sin = sin + f32(0) * cos  # as in C, where it keeps the loop vectorizable
        theta_dot = theta_dot + (self.gravity_term * sin + self.torque_term * torque) * self.dt
        theta_dot = np.clip(theta_dot, -self.max_speed, self.max_speed)
        self.theta = wrap_angle(theta + theta_dot * self.dt).astype(np.float32)
        self.theta_dot = theta_dot.astype(np.float32)
        rewards = (-cost).astype(np.float32)
        self.returns = (self.returns + rewards).astype(np.float32)
        self.steps += 1
        terminals = np.zeros(self.num_envs, bool)
        truncations = self.steps >= self.max_steps
        observations = self._end_episodes(self.observations(), terminals, truncations)
        return observations, rewards, terminals, truncations, {}
