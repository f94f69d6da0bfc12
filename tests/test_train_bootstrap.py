"""Truncation bootstrapping and GAE, checked on a toy env whose values are known.

Also home of CounterEnv, the tiny Python env with the batch interface that the
other trainer tests import.

CounterEnv: every row counts steps within its episode; the observation is
that count, the reward is 1 per step and the episode ends after `limit` steps,
as a truncation (default) or a termination. Rows start staggered so episode
ends fall on different steps. The true value of a state under truncation is
1 / (1 - gamma) whatever the count; under termination it depends on the count.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from toy_envs import ToyBatch


class CounterEnv(ToyBatch):
    def __init__(self, num_envs=8, limit=5, terminal=False, action_space=None, both_flags=False):
        super().__init__(num_envs, 1, action_space or spaces.Discrete(2, dtype=np.int32))
        self.limit, self.terminal, self.both_flags = limit, terminal, both_flags
        self.masks = np.ones(num_envs, bool)
        self.counts = np.zeros(num_envs, np.int64)
        self.returns = np.zeros(num_envs)
        self.steps_taken = 0
        self.last_actions = None

    def reset(self, seed=None):
        self.counts[:] = np.arange(self.num_envs) % self.limit
        self.returns[:] = 0
        self.observations[:, 0] = self.counts
        return self.observations, {}

    def step(self, actions):
        assert isinstance(actions, np.ndarray) and actions.dtype == self.single_action_space.dtype
        self.last_actions = actions.copy()
        self.steps_taken += 1
        self.counts += 1
        self.returns += 1
        self.rewards[:] = 1.0
        ended = self.counts >= self.limit
        self.terminals[:] = ended & self.terminal
        self.truncations[:] = ended & ((not self.terminal) or self.both_flags)
        self.final_observations[ended, 0] = self.counts[ended]
        self.record_episodes(self.returns[ended], self.returns[ended])   # reward 1 per step
        self.returns[ended] = 0
        self.counts[ended] = 0
        self.observations[:, 0] = self.counts
        return self.observations, self.rewards, self.terminals, self.truncations, {}


# ---- tests ---------------------------------------------------------------------

def make_trainer(env, **train):
    from peregrine.train.config import load_config
    from peregrine.train.ppo import Trainer
    overrides = [("vec.num_envs", env.num_envs), ("train.horizon", 12),
                 ("train.minibatch_size", 32), ("train.update_epochs", 2)]
    overrides += [(f"train.{k}", v) for k, v in train.items()]
    return Trainer(load_config("cartpole", overrides=overrides), env=env)


def reference_gae(rewards, values, terminals, truncations, final_values, last_value, gamma, lam):
    """Textbook GAE, one row and one step at a time, with explicit bootstrapping:
    a truncated step's target is r + gamma * V(final observation), a terminal
    step's is r, any other step's is r + gamma * V(next observation)."""
    T, N = rewards.shape
    advantages = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminals[t, n]:
                delta, running = rewards[t, n] - values[t, n], 0.0
            elif truncations[t, n]:
                delta, running = rewards[t, n] + gamma * final_values[t, n] - values[t, n], 0.0
            else:
                next_value = values[t + 1, n] if t + 1 < T else last_value[n]
                delta = rewards[t, n] + gamma * next_value - values[t, n]
            running = delta + gamma * lam * running
            advantages[t, n] = running
    return advantages


@pytest.mark.parametrize("terminal, both_flags", [(False, False), (True, False), (True, True)])
def test_rollout_advantages_match_reference(terminal, both_flags):
    """The trainer's advantages equal a per-row reference that bootstraps truncated rows
    from V(final observation) and terminal rows from nothing (also when a row carries
    both flags: it ended for real)."""
    gamma, lam = 0.9, 0.8
    env = CounterEnv(num_envs=6, limit=5, terminal=terminal, both_flags=both_flags)
    trainer = make_trainer(env, gamma=gamma, gae_lambda=lam)
    value_of = lambda obs: 3.0 + 0.5 * obs[:, 0].float()  # noqa: E731 - V(count), known
    heads = trainer.policy.heads

    def patched_heads(obs, state=None, starts=None, critic_states=None):
        params, _values, state = heads(obs, state, starts, critic_states)
        return params, value_of(obs), state

    trainer.policy.heads = patched_heads
    trainer.policy.value = lambda obs, state=None, starts=None, critic_states=None: \
        value_of(obs)
    counts_before = env.counts.copy()
    trainer.rollout()

    T, N = trainer.horizon, env.num_envs
    counts = (counts_before[None, :] + np.arange(T)[:, None]) % env.limit   # count at obs t
    ended = counts + 1 >= env.limit
    terminals, truncations = ended & terminal, ended & (not terminal)
    values = 3.0 + 0.5 * counts
    final_values = np.full((T, N), 3.0 + 0.5 * env.limit)
    last_value = 3.0 + 0.5 * ((counts[-1] + 1) % env.limit)
    rewards = np.ones((T, N))
    expected = reference_gae(rewards, values, terminals, truncations, final_values, last_value,
                             gamma, lam)
    np.testing.assert_allclose(trainer.storage.obs[:, :, 0].numpy(), counts)
    np.testing.assert_allclose(trainer.storage.advantages.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(trainer.storage.returns.numpy(), expected + values, rtol=1e-5, atol=1e-5)
    trainer.close()


def test_true_value_gives_zero_advantage_under_truncation():
    """Truncation is not termination: with V = 1/(1-gamma) everywhere (the true value when
    episodes are only cut off), every advantage is zero. Treating the cut as terminal would
    give -V * gamma at each cut."""
    gamma = 0.9
    env = CounterEnv(num_envs=4, limit=3)
    trainer = make_trainer(env, gamma=gamma, gae_lambda=0.95)
    true_value = 1.0 / (1.0 - gamma)
    heads = trainer.policy.heads

    def patched_heads(obs, state=None, starts=None, critic_states=None):
        params, _values, state = heads(obs, state, starts, critic_states)
        return params, torch.full((obs.shape[0],), true_value), state

    trainer.policy.heads = patched_heads
    trainer.policy.value = lambda obs, *args: torch.full((obs.shape[0],), true_value)
    trainer.rollout()
    assert trainer.storage.dones.any()
    np.testing.assert_allclose(trainer.storage.advantages.numpy(), 0.0, atol=1e-5)
    trainer.close()


def test_learned_value_converges_to_bootstrapped_value():
    """End to end: training on constant-reward episodes cut off every 4 steps, the critic
    learns V ~ 1/(1-gamma) = 5 for every state (not the ~2.3 truncation-as-terminal gives)."""
    from peregrine.train.config import load_config
    from peregrine.train.ppo import Trainer
    gamma = 0.8
    env = CounterEnv(num_envs=16, limit=4)
    config = load_config("cartpole", overrides=[
        ("vec.num_envs", 16), ("train.horizon", 16), ("train.minibatch_size", 256),
        ("train.update_epochs", 4), ("train.gamma", gamma), ("train.gae_lambda", 0.9),
        ("train.learning_rate", 1e-2), ("train.anneal_lr", False), ("train.total_steps", 256 * 60)])
    trainer = Trainer(config, env=env)
    while not trainer.done:
        trainer.update()
    with torch.no_grad():
        values = trainer.policy.value(torch.arange(4, dtype=torch.float32).unsqueeze(1))
    np.testing.assert_allclose(values.numpy(), 1.0 / (1.0 - gamma), rtol=0.1)
    trainer.close()


def test_gae_matches_reference_on_random_data():
    from peregrine.train.ppo import compute_gae
    rng = np.random.default_rng(0)
    T, N, gamma, lam = 7, 5, 0.97, 0.9
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    terminals = rng.random((T, N)) < 0.2
    last_value = rng.normal(size=N)
    expected = reference_gae(rewards, values, terminals, np.zeros_like(terminals), None,
                             last_value, gamma, lam)
    inputs = (torch.tensor(rewards, dtype=torch.float32), torch.tensor(values, dtype=torch.float32),
              torch.tensor(terminals), torch.tensor(last_value, dtype=torch.float32), gamma, lam)
    np.testing.assert_allclose(compute_gae(*inputs).numpy(), expected, rtol=1e-5, atol=1e-5)
    # the torch path (off-CPU devices, and compiled with train.compile on CUDA)
    from peregrine.train.advantages import gae_scan
    np.testing.assert_allclose(gae_scan(*inputs).numpy(), expected, rtol=1e-5, atol=1e-5)
