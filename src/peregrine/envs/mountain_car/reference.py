"""MountainCar in NumPy: the readable reference for mountain_car.h.

The same rules, in the same float32 operation order, drawing from the same
splitmix64 streams and using the same sincos, so that for one seed and one
action sequence it produces the C batch's observations bit for bit.

`MountainCarReference` holds what both variants share (the track, the move
rule, resets and episode bookkeeping, as mountain_car_common.h does in C);
a variant supplies its constants, its acceleration and its reward.
"""
from __future__ import annotations

import numpy as np

from ..reference.pg_math import sincos
from ..reference.batch import ReferenceBatch
from . import MountainCar

f32 = np.float32
MIN_POSITION, MAX_POSITION = f32(-1.2), f32(0.6)


def cos3(position: np.ndarray) -> np.ndarray:
    """cos(3 position) exactly as mountain_car_cos3 in C (the 0 * sin term
    keeps the C loop vectorizable and changes no finite value)."""
    sin_3x, cos_3x = sincos(f32(3.0) * position)
    return cos_3x + f32(0) * sin_3x


class MountainCarReference(ReferenceBatch):
    """Batch of MountainCar instances with NativeEnv's reset/step contract."""

    env_class = MountainCar
    obs_dim = 2

    def setup(self, c):
        self.goal_position, self.goal_velocity = f32(c["goal_position"]), f32(c["goal_velocity"])
        self.gravity, self.max_speed = f32(c["gravity"]), f32(c["max_speed"])
        self.configure(c)
        self.position = np.zeros(self.num_envs, np.float32)
        self.velocity = np.zeros(self.num_envs, np.float32)
        self.episode_successes: list[float] = []

    # ---- what a variant defines ------------------------------------------
    def configure(self, c):
        self.force = f32(c["force"])

    def acceleration(self, actions):
        """(acceleration, anything the reward needs) for this step's actions."""
        actions = np.asarray(actions).reshape(self.num_envs)
        push = (actions - 1).astype(np.float32) * self.force  # -force, 0 or +force
        return push + cos3(self.position) * -self.gravity, None

    def rewards(self, terminals, _reward_input):
        return np.full(self.num_envs, -1.0, np.float32)

    # ---- shared ----------------------------------------------------------------
    def observations(self) -> np.ndarray:
        return np.stack([self.position, self.velocity], axis=1)

    def _reset_instances(self, idx):
        self.position[idx] = self.streams.uniform_range(idx, -0.6, -0.4)
        self.velocity[idx] = 0
        self.returns[idx] = 0
        self.steps[idx] = 0

    def _move(self, acceleration):
        """Velocity then position, clipped; the left wall is inelastic (see
        mountain_car_move in C). Returns which instances reached the goal."""
        velocity = np.clip(self.velocity + acceleration, -self.max_speed, self.max_speed)
        position = self.position + velocity
        at_wall = position <= MIN_POSITION
        position = np.minimum(np.where(at_wall, MIN_POSITION, position), MAX_POSITION)
        velocity = np.where(at_wall, f32(0), velocity)
        self.position, self.velocity = position.astype(np.float32), velocity.astype(np.float32)
        return (self.position >= self.goal_position) & (self.velocity >= self.goal_velocity)

    def step(self, actions):
        acceleration, reward_input = self.acceleration(actions)
        terminals = self._move(acceleration)
        self.steps += 1
        truncations = ~terminals & (self.steps >= self.max_steps)
        rewards = self.rewards(terminals, reward_input)
        self.returns = (self.returns + rewards).astype(np.float32)
        observations = self._end_episodes(self.observations(), terminals, truncations)
        return observations, rewards, terminals, truncations, {}

    def _record(self, done, terminals):
        self.episode_successes.extend(terminals[done].astype(float))
