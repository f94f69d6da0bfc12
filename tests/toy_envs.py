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


class CoinTeamEnv(ToyBatch):
    """A cooperative two-agent task for the centralised critic (test_train_critic.py).

    Each of `num_envs` instances holds two agents (rows 2i and 2i + 1). At the
    start of an episode each agent gets a coin c in {-1, +1}; its observation is
    its own coin only. Every step each agent earns `team * c_0 * c_1` (the same
    for both: the team's luck) plus 1 when its action says which side its own
    coin shows (action 1 for +1). Episodes are cut after `limit` steps by
    truncation (bootstrapped from the state the episode ended on).

    So a drone's own observation says nothing about the team term (E[c_0 c_1 |
    c_a] = 0) while the global state, (c_0, c_1), predicts it exactly: the true
    value is (team * c_0 c_1 + p_correct) / (1 - gamma). The global state is
    written only once `enable_states()` was called, as the env contract says.
    """

    agents_per_env = 2

    def __init__(self, num_envs=32, limit=5, team=1.0, seed=0):
        super().__init__(2 * num_envs, 1, spaces.Discrete(2, dtype=np.int32))
        self.num_envs, self.limit, self.team = num_envs, limit, team
        self.state_dim = 2
        self.single_state_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.states = self.final_states = None
        self.masks = np.ones(self.num_agents, bool)
        self.rng = np.random.default_rng(seed)
        self.coins = np.ones((num_envs, 2), np.float32)
        self.counts = np.zeros(num_envs, np.int64)
        self.returns = np.zeros(num_envs)
        self.correct = 0
        self.actions_taken = 0

    def enable_states(self):
        if self.states is None:
            self.states = np.zeros((self.num_envs, 2), np.float32)
            self.final_states = np.zeros_like(self.states)
            self.states[:] = self.coins
        return self.states

    def _deal(self, instances):
        self.coins[instances] = self.rng.choice(np.float32([-1.0, 1.0]), (len(instances), 2))
        self.counts[instances] = 0
        self.returns[instances] = 0
        self.observations[:, 0] = self.coins.reshape(-1)
        if self.states is not None:
            self.states[instances] = self.coins[instances]

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._deal(np.arange(self.num_envs))
        return self.observations, {}

    def step(self, actions):
        own = self.coins.reshape(-1)
        right = (actions == (own > 0)).astype(np.float32)
        self.correct += int(right.sum())
        self.actions_taken += right.size
        team = np.repeat(self.team * self.coins[:, 0] * self.coins[:, 1], 2)
        self.rewards[:] = team + right
        self.returns += (team + right).reshape(-1, 2).mean(1)
        self.counts += 1
        ended = self.counts >= self.limit
        rows = np.repeat(ended, 2)
        self.terminals[:] = False
        self.truncations[:] = rows
        self.final_observations[rows] = self.observations[rows]
        if self.states is not None:
            self.final_states[ended] = self.states[ended]
        self.record_episodes(self.returns[ended], self.counts[ended])
        self._deal(np.flatnonzero(ended))
        return self.observations, self.rewards, self.terminals, self.truncations, {}

    def accuracy(self) -> float:
        """Fraction of correct actions since the last call."""
        value = self.correct / max(self.actions_taken, 1)
        self.correct = self.actions_taken = 0
        return value
