"""What the classic-control NumPy references share: episode bookkeeping.

A reference is the readable twin of an env's C core: a batch of instances
with NativeEnv's reset/step contract, vectorized over instances, drawing from
the same splitmix64 streams (`rng.Streams`) so it reproduces the C batch bit
for bit. `ReferenceBatch` holds the parts that are the same for every
classic-control env: the config (resolved by the env class), step counts and
returns, reset with an optional new seed, and the end-of-step pass that
records finished episodes (return, length), keeps their final observations
and resets them, as the C cores' finish-episodes pass does.

A subclass sets `env_class` and `obs_dim` and defines `setup(config)` (its
constants and state arrays), `observations()`, `_reset_instances(idx)` (in the
C draw order; it must zero `returns` and `steps` of those rows) and `step`.
"""
from __future__ import annotations

import numpy as np

from .rng import Streams


class ReferenceBatch:
    env_class: type
    obs_dim: int

    def __init__(self, num_envs: int = 1, seed: int = 0, **config):
        self.num_envs = self.num_agents = num_envs
        self.config = self.env_class.resolve_config(config)
        self.max_steps = int(self.config["max_steps"])
        self.returns = np.zeros(num_envs, np.float32)
        self.steps = np.zeros(num_envs, np.int64)
        self.final_observations = np.zeros((num_envs, self.obs_dim), np.float32)
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.setup(self.config)
        self.reset(seed)

    def setup(self, config) -> None:
        raise NotImplementedError

    def reset(self, seed=None):
        if seed is not None:
            self.streams = Streams(seed, self.num_envs)
        self._reset_instances(np.arange(self.num_envs))
        return self.observations(), {}

    def _end_episodes(self, observations, terminals, truncations):
        """Records and resets the instances that ended; returns `observations`
        with their rows replaced by the new episodes' first observations."""
        done = np.flatnonzero(terminals | truncations)
        if done.size:
            self.final_observations[done] = observations[done]
            self.episode_returns.extend(self.returns[done].astype(float))
            self.episode_lengths.extend(self.steps[done].astype(int))
            self._record(done, terminals)
            self._reset_instances(done)
            observations[done] = self.observations()[done]
        return observations

    def _record(self, done, terminals) -> None:
        """Hook for env-specific episode statistics of the rows in `done`."""
