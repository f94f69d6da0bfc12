"""The buffers and bookkeeping shared by the tiny Python envs of the trainer tests.

`ToyBatch` holds what the trainer reads from a batch env: the spaces, the
observation / final-observation / reward / terminal / truncation buffers
(updated in place), `episode_stats` over the episodes recorded with
`record_episodes`, and `close`. Subclasses write `reset` and `step`
(CounterEnv in test_train_bootstrap.py, MaskEnv in test_train_masking.py,
RuleEnv in test_train_teacher.py).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from peregrine.envs.native.batch import EpisodeStats


class ToyBatch:
    def __init__(self, num_envs, obs_dim, action_space):
        self.num_envs = self.num_agents = num_envs
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.single_action_space = action_space
        self.observations = np.zeros((num_envs, obs_dim), np.float32)
        self.final_observations = np.zeros_like(self.observations)
        self.rewards = np.zeros(num_envs, np.float32)
        self.terminals = np.zeros(num_envs, bool)
        self.truncations = np.zeros(num_envs, bool)
        self.finished: list[tuple[float, float]] = []   # (return, length) per episode

    def record_episodes(self, returns, lengths) -> None:
        self.finished += zip(np.asarray(returns, float).tolist(),
                             np.asarray(lengths, float).tolist())

    def episode_stats(self, clear=True):
        values = np.asarray(self.finished, float).reshape(-1, 2)
        if clear:
            self.finished = []
        if len(values) == 0:
            return EpisodeStats()
        names = ("episode_return", "episode_length")
        mean = dict(zip(names, values.mean(0).tolist()))
        std = dict(zip(names, values.std(0).tolist()))
        return EpisodeStats(len(values), mean, std)

    def close(self):
        pass
