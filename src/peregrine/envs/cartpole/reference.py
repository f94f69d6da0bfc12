"""CartPole in NumPy: the readable reference for cartpole.h.

The same rules, in the same float32 operation order, drawing from the same
splitmix64 streams, so that for one seed and one action sequence it produces
the C batch's observations bit for bit. It is vectorized over instances and
also serves as the "NumPy CartPole" in the benchmarks.
"""
from __future__ import annotations

import numpy as np

from ..reference.pg_math import sincos
from ..reference.batch import ReferenceBatch
from . import CartPole

f32 = np.float32


class CartPoleReference(ReferenceBatch):
    """Batch of CartPole instances with NativeEnv's reset/step contract."""

    env_class = CartPole
    obs_dim = 4

    def setup(self, c):
        self.gravity, self.masspole = f32(c["gravity"]), f32(c["masspole"])
        self.total_mass = self.masspole + f32(c["masscart"])
        self.length = f32(c["length"])
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = f32(c["force_mag"]), f32(c["tau"])
        self.x_threshold, self.theta_threshold = f32(c["x_threshold"]), f32(c["theta_threshold"])
        self.state = np.zeros((self.num_envs, 4), np.float32)  # x, x_dot, theta, theta_dot

    def observations(self) -> np.ndarray:
        return self.state.copy()

    def _reset_instances(self, idx):
        for column in range(4):  # draw order: x, x_dot, theta, theta_dot
            self.state[idx, column] = self.streams.uniform_range(idx, -0.05, 0.05)
        self.returns[idx] = 0
        self.steps[idx] = 0

    def step(self, actions):
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(actions == 1, self.force_mag, -self.force_mag).astype(np.float32)
        sintheta, costheta = sincos(theta)
        temp = (force + self.polemass_length * (theta_dot * theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (f32(4.0 / 3.0) - self.masspole * (costheta * costheta) / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = np.stack([x, x_dot, theta, theta_dot], axis=1).astype(np.float32)
        self.steps += 1
        terminals = (x < -self.x_threshold) | (x > self.x_threshold) | \
                    (theta < -self.theta_threshold) | (theta > self.theta_threshold)
        truncations = ~terminals & (self.steps >= self.max_steps)
        rewards = np.ones(self.num_envs, np.float32)
        self.returns += rewards
        observations = self._end_episodes(self.observations(), terminals, truncations)
        return observations, rewards, terminals, truncations, {}
