"""MountainCar in NumPy: the readable reference for mountain_car.h.

The same rules, in the same float32 operation order, drawing from the same
splitmix64 streams and using the same sincos, so that for one seed and one
action sequence it produces the C batch's observations bit for bit.
"""
from __future__ import annotations

import numpy as np

from ..pg_math import sincos
from ..rng import Streams
from . import MountainCar

f32 = np.float32
MIN_POSITION, MAX_POSITION = f32(-1.2), f32(0.6)


class MountainCarReference:
    """Batch of MountainCar instances with NativeEnv's reset/step contract."""

    def __init__(self, num_envs: int = 1, seed: int = 0, **config):
        self.num_envs = self.num_agents = num_envs
        self.config = MountainCar.resolve_config(config)
        c = self.config
        self.max_steps = int(c["max_steps"])
        self.goal_position, self.goal_velocity = f32(c["goal_position"]), f32(c["goal_velocity"])
        self.force, self.gravity, self.max_speed = f32(c["force"]), f32(c["gravity"]), f32(c["max_speed"])
        self.position = np.zeros(num_envs, np.float32)
        self.velocity = np.zeros(num_envs, np.float32)
        self.steps = np.zeros(num_envs, np.int64)
        self.final_observations = np.zeros((num_envs, 2), np.float32)
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.episode_successes: list[float] = []
        self.reset(seed)

    def observations(self) -> np.ndarray:
        return np.stack([self.position, self.velocity], axis=1)

    def _reset_instances(self, idx):
        self.position[idx] = self.streams.uniform_range(idx, -0.6, -0.4)
        self.velocity[idx] = 0
        self.steps[idx] = 0

    def reset(self, seed=None):
        if seed is not None:
            self.streams = Streams(seed, self.num_envs)
        self._reset_instances(np.arange(self.num_envs))
        return self.observations(), {}

    def step(self, actions):
        actions = np.asarray(actions).reshape(self.num_envs)
        push = (actions - 1).astype(np.float32) * self.force
        sin_3x, cos_3x = sincos(f32(3.0) * self.position)
        cos_3x = cos_3x + f32(0) * sin_3x  # as in C, where it keeps the loop vectorizable
        velocity = self.velocity + (push + cos_3x * -self.gravity)
        velocity = np.clip(velocity, -self.max_speed, self.max_speed)
        position = self.position + velocity
        # Gymnasium zeroes the velocity when the clipped position sits on the
        # left wall while moving left; as positions never start past the wall
        # that is "the unclipped position is at or past it" (see the C header).
        at_wall = position <= MIN_POSITION
        position = np.minimum(np.where(at_wall, MIN_POSITION, position), MAX_POSITION)
        velocity = np.where(at_wall, f32(0), velocity)
        self.position, self.velocity = position.astype(np.float32), velocity.astype(np.float32)
        self.steps += 1
        terminals = (self.position >= self.goal_position) & (self.velocity >= self.goal_velocity)
        truncations = ~terminals & (self.steps >= self.max_steps)
        rewards = np.full(self.num_envs, -1.0, np.float32)
        observations = self.observations()
        done = np.flatnonzero(terminals | truncations)
        if done.size:
            self.final_observations[done] = observations[done]
            self.episode_returns.extend(-self.steps[done].astype(float))
            self.episode_lengths.extend(self.steps[done].astype(int))
            self.episode_successes.extend(terminals[done].astype(float))
            self._reset_instances(done)
            observations[done] = self.observations()[done]
        return observations, rewards, terminals, truncations, {}
