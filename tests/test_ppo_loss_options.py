"""ppo_loss's options on hand-made minibatches: advantage normalisation on and off
(and left alone for a single sample, whose spread is undefined), the unclipped value loss."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from peregrine.train.config import TrainConfig
from peregrine.train.loss import Evaluation, ppo_loss


def minibatch(advantages, values=None, returns=None):
    advantages = torch.tensor(advantages, dtype=torch.float32)
    n = advantages.numel()
    logprobs = torch.full((n,), -0.7)
    values = torch.zeros(n) if values is None else torch.tensor(values, dtype=torch.float32)
    returns = torch.zeros(n) if returns is None else torch.tensor(returns, dtype=torch.float32)
    evaluation = Evaluation(logprobs.clone(), torch.zeros(n), values, None, None)  # ratio 1
    batch = {"logprobs": logprobs, "advantages": advantages, "returns": returns,
             "values": torch.zeros(n)}
    return evaluation, batch


def config(**changes):
    return dataclasses.replace(TrainConfig(), ent_coef=0.0, **changes)


def test_without_normalisation_the_policy_loss_is_minus_the_mean_advantage():
    evaluation, batch = minibatch([1.0, 2.0, 6.0])
    _, stats = ppo_loss(evaluation, batch, config(norm_adv=False))
    assert stats.policy_loss == pytest.approx(-3.0)
    _, stats = ppo_loss(evaluation, batch, config(norm_adv=True))
    assert stats.policy_loss == pytest.approx(0.0, abs=1e-6)      # normalised: mean 0


def test_a_single_sample_keeps_its_advantage_when_normalising():
    evaluation, batch = minibatch([2.5])
    loss, stats = ppo_loss(evaluation, batch, config(norm_adv=True))
    assert stats.policy_loss == pytest.approx(-2.5) and torch.isfinite(loss)


def test_the_value_loss_clipped_or_not():
    evaluation, batch = minibatch([0.0, 0.0], values=[1.0, -3.0], returns=[2.0, 0.0])
    _, plain = ppo_loss(evaluation, batch, config(clip_vloss=False))
    assert plain.value_loss == pytest.approx(0.5 * (1.0 + 9.0) / 2)
    _, clipped = ppo_loss(evaluation, batch, config(clip_vloss=True, clip_coef=0.2))
    # old values 0: the clipped predictions 0.2 and -0.2 are worse, so the larger error counts
    assert clipped.value_loss == pytest.approx(0.5 * ((2.0 - 0.2) ** 2 + 9.0) / 2)


def test_policy_init_torch_keeps_pytorch_defaults_and_orthogonal_is_the_default():
    import math

    import gymnasium as gym
    import numpy as np
    import torch

    from peregrine.train.config import PolicyConfig
    from peregrine.train.policy import Policy
    observations = gym.spaces.Box(-1, 1, (17,), np.float32)
    actions = gym.spaces.Box(-1, 1, (6,), np.float32)
    torch.manual_seed(0)
    orthogonal = Policy(observations, actions, PolicyConfig(hidden_size=32))
    torch.manual_seed(0)
    default = Policy(observations, actions, PolicyConfig(hidden_size=32, init="torch"))
    for policy, zero_biases in ((orthogonal, True), (default, False)):
        linears = [m for m in policy.modules() if isinstance(m, torch.nn.Linear)]
        assert len(linears) == 6            # two hidden layers each side, two heads
        for layer in linears:
            assert bool((layer.bias == 0).all()) == zero_biases
    head = orthogonal.actor_head.weight     # orthogonal rows scaled by the head's gain 0.01
    assert torch.allclose(head @ head.T, 1e-4 * torch.eye(6), atol=1e-7)
    for layer in (m for m in default.modules() if isinstance(m, torch.nn.Linear)):
        bound = 1 / math.sqrt(layer.in_features)     # kaiming-uniform, a = sqrt(5)
        assert float(layer.weight.detach().abs().max()) <= bound
    assert float(default.actor_head.weight.detach().abs().max()) > 0.05  # not the 0.01-gain head
    assert torch.equal(default.log_std, torch.zeros(6))         # init_log_std is kept
