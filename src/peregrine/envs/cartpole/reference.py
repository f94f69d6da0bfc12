"""CartPole in NumPy: the readable reference for cartpole.h.

The same rules, in the same float32 operation order, drawing from the same
splitmix64 streams, so that for one seed and one action sequence it produces
the C batch's observations bit for bit. It is vectorized over instances and
also serves as the "NumPy CartPole" in the benchmarks.
"""
from __future__ import annotations

import numpy as np

from ..pg_math import sincos
from ..rng import Streams
from . import CartPole

f32 = np.float32


class CartPoleReference:
    """Batch of CartPole instances with NativeEnv's reset/step contract."""

    def __init__(self, num_envs: int = 1, seed: int = 0, **config):
        self.num_envs = self.num_agents = num_envs
        self.config = CartPole.resolve_config(config)
        c = self.config
        self.max_steps = int(c["max_steps"])
        self.gravity, self.masspole = f32(c["gravity"]), f32(c["masspole"])
        self.total_mass = self.masspole + f32(c["masscart"])
        self.length = f32(c["length"])
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = f32(c["force_mag"]), f32(c["tau"])
        self.x_threshold, self.theta_threshold = f32(c["x_threshold"]), f32(c["theta_threshold"])
        self.state = np.zeros((num_envs, 4), np.float32)  # x, x_dot, theta, theta_dot
        self.steps = np.zeros(num_envs, np.int64)
        self.final_observations = np.zeros((num_envs, 4), np.float32)
        self.episode_returns: list[float] = []
        self.reset(seed)

    def _reset_instances(self, idx):
        for column in range(4):  # draw order: x, x_dot, theta, theta_dot
            self.state[idx, column] = self.streams.uniform_range(idx, -0.05, 0.05)
        self.steps[idx] = 0

    def reset(self, seed=None):
        if seed is not None:
            self.streams = Streams(seed, self.num_envs)
        self._reset_instances(np.arange(self.num_envs))
        return self.state.copy(), {}

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
        done = np.flatnonzero(terminals | truncations)
        if done.size:
            self.final_observations[done] = self.state[done]
            self.episode_returns.extend(self.steps[done].astype(float))
            self._reset_instances(done)
        return self.state.copy(), rewards, terminals, truncations, {}
