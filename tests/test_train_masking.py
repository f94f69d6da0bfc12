"""Invalid-action masking in the trainer (policy.action_mask).

MaskEnv: a tiny batch env with Discrete(N) actions whose observation carries a
fresh random valid-action mask each step in columns 1..N (declared by
`action_mask_slice`); column 0 is a large constant so observation
normalisation moves the mask columns far from 0/1. Reward is 1 for a valid
action, 0 for an invalid one (which, like Prospector, acts as a no-op).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.policy import Policy, mask_logits
from peregrine.train.ppo import Trainer
from toy_envs import ToyBatch

N = 6


class MaskEnv(ToyBatch):
    action_mask_slice = slice(1, 1 + N)

    def __init__(self, num_envs=16, limit=8, seed=0):
        super().__init__(num_envs, 1 + N, spaces.Discrete(N))
        self.limit = limit
        self.rng = np.random.default_rng(seed)
        self.counts = np.zeros(num_envs, np.int64)
        self.returns = np.zeros(num_envs)
        self.valid_taken = 0
        self.invalid_taken = 0

    def _new_masks(self):
        masks = self.rng.random((self.num_envs, N)) < 0.3
        masks[np.arange(self.num_envs), self.rng.integers(0, N, self.num_envs)] = True
        self.observations[:, 0] = 100.0
        self.observations[:, 1:] = masks

    def reset(self, seed=None):
        self.counts[:] = 0
        self.returns[:] = 0
        self._new_masks()
        return self.observations, {}

    def step(self, actions):
        actions = np.asarray(actions)
        valid = self.observations[np.arange(self.num_envs), 1 + actions] > 0.5
        self.valid_taken += int(valid.sum())
        self.invalid_taken += int((~valid).sum())
        self.rewards[:] = valid
        self.returns += valid
        self.counts += 1
        ended = self.counts >= self.limit
        self.terminals[:] = False
        self.truncations[:] = ended
        self._new_masks()
        self.final_observations[ended] = self.observations[ended]
        self.record_episodes(self.returns[ended], self.counts[ended])
        self.returns[ended] = 0
        self.counts[ended] = 0
        return self.observations, self.rewards, self.terminals, self.truncations, {}


def make_trainer(env, mask="auto", **train):
    overrides = [("vec.num_envs", env.num_envs), ("train.horizon", 16),
                 ("train.minibatch_size", 64), ("train.update_epochs", 2),
                 ("train.total_steps", 10 * 16 * env.num_envs), ("policy.action_mask", mask)]
    overrides += [(f"train.{k}", v) for k, v in train.items()]
    return Trainer(load_config("cartpole", overrides=overrides), env=env)


# ---- the categorical head ------------------------------------------------------------

def _policy(n=N):
    config = load_config("cartpole").policy
    obs_space = spaces.Box(-1, 1, (3,), np.float32)
    return Policy(obs_space, spaces.Discrete(n), config)


def test_masked_actions_are_never_sampled():
    policy = _policy()
    generator = torch.Generator().manual_seed(0)
    rows = 4000
    logits = torch.randn(rows, N) * 3
    logits[:, 0] = 20.0                    # the favourite action is often masked out
    mask = torch.rand(rows, N) < 0.4
    mask[torch.arange(rows), torch.randint(0, N, (rows,))] = True
    actions, logprobs = policy.sample(logits, generator, mask)
    assert mask.gather(1, actions.unsqueeze(1)).all()
    assert torch.isfinite(logprobs).all()
    unmasked, _ = policy.sample(logits, generator)
    assert not mask.gather(1, unmasked.unsqueeze(1)).all()   # without the mask they occur
    # The mode respects the mask too.
    assert mask.gather(1, policy.deterministic(logits, mask).unsqueeze(1)).all()


def test_masked_actions_are_never_sampled_at_the_ends_of_the_uniform_draw():
    """Inverse-CDF sampling at u = 0 and at the largest float below 1 (where the valid
    probabilities can sum to less than u): a masked first or last action was taken
    there, with a stored log-prob of -1e9 that later made a bf16 run's PPO ratio
    overflow (a Prospector run went NaN)."""
    torch.manual_seed(0)
    rows = 20000
    logits = torch.randn(rows, N) * 3
    mask = torch.ones(rows, N, dtype=torch.bool)
    mask[:, 0] = mask[:, -1] = False
    below_one = torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)).item()
    for u in (0.0, below_one):
        actions, logprobs = Policy._categorical_from(mask_logits(logits, mask),
                                                     torch.full((rows, 1), u))
        assert mask.gather(1, actions.unsqueeze(1)).all(), u
        assert (logprobs > -100).all(), u


def test_logprob_and_entropy_equal_a_categorical_over_valid_actions():
    policy = _policy()
    torch.manual_seed(1)
    rows = 64
    logits = torch.randn(rows, N, requires_grad=True)
    mask = torch.rand(rows, N) < 0.5
    mask[torch.arange(rows), torch.randint(0, N, (rows,))] = True
    mask[0] = False                        # a row with no valid action: left unmasked, no NaN
    actions = torch.multinomial(mask.float() + (~mask.any(1, keepdim=True)).float(), 1)[:, 0]
    logprob, entropy = policy.log_prob_entropy(logits, actions, True, mask)
    for row in range(rows):
        valid = mask[row] if mask[row].any() else torch.ones(N, dtype=torch.bool)
        index = valid.nonzero().squeeze(1)
        dist = torch.distributions.Categorical(logits=logits[row, index])
        position = (index == actions[row]).nonzero().item()
        assert torch.allclose(logprob[row], dist.log_prob(torch.tensor(position)), atol=1e-5)
        assert torch.allclose(entropy[row], dist.entropy(), atol=1e-5)
    (logprob.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()
    assert (logits.grad[1:][~mask[1:]] == 0).all()   # invalid logits get no gradient


# ---- the trainer ----------------------------------------------------------------------

@pytest.mark.parametrize("normalize_obs, lstm", [(False, False), (True, False), (False, True)])
def test_rollouts_never_contain_invalid_actions(normalize_obs, lstm):
    """The mask is read from the RAW observation: with normalisation on, the stored
    (normalised) mask columns are no longer 0/1, yet every action stays valid."""
    env = MaskEnv()
    if lstm:
        overrides = [("vec.num_envs", env.num_envs), ("train.horizon", 16),
                     ("train.minibatch_size", 64), ("policy.lstm", True),
                     ("policy.bptt_horizon", 8)]
        trainer = Trainer(load_config("cartpole", overrides=overrides), env=env)
    else:
        trainer = make_trainer(env, normalize_obs=normalize_obs)
    assert trainer.pipeline.mask_slice == MaskEnv.action_mask_slice
    for _ in range(3):
        record = trainer.update()
        assert np.isfinite(record["losses"]["policy_loss"])
    assert env.invalid_taken == 0 and env.valid_taken == 3 * 16 * env.num_envs
    trainer.close()


def test_mask_off_lets_invalid_actions_through():
    env = MaskEnv()
    trainer = make_trainer(env, mask="false")
    assert trainer.pipeline.mask_slice is None
    trainer.update()
    assert env.invalid_taken > 0
    trainer.close()


def test_masked_return_beats_unmasked():
    returns = {}
    for mask in ("auto", "false"):
        env = MaskEnv(seed=3)
        trainer = make_trainer(env, mask=mask)
        while not trainer.done:
            record = trainer.update()
        returns[mask] = record["episode_return"]
        trainer.close()
    assert returns["auto"] == 8.0             # every step rewarded
    assert returns["false"] < 6.0, returns


def test_bool_and_bad_config_values():
    config = load_config("cartpole", overrides=[("policy.action_mask", False)])
    assert config.policy.action_mask == "false"
    with pytest.raises(ValueError, match="action_mask"):
        load_config("cartpole", overrides=[("policy.action_mask", "sometimes")])


def test_slice_that_does_not_fit_is_rejected():
    class Wrong(MaskEnv):
        action_mask_slice = slice(0, 3)
    with pytest.raises(ValueError, match="action_mask_slice"):
        make_trainer(Wrong())


# ---- load_actor on Prospector -------------------------------------------------------

@pytest.mark.parametrize("normalize_obs", [False, True])
def test_load_actor_plays_only_valid_prospector_actions(tmp_path, normalize_obs):
    import peregrine
    from peregrine.envs.prospector import action_mask
    config = load_config("prospector", overrides=[
        ("vec.num_envs", 8), ("train.horizon", 16), ("train.minibatch_size", 64),
        ("train.update_epochs", 1), ("train.normalize_obs", normalize_obs)])
    trainer = Trainer(config)
    assert trainer.pipeline.mask_slice == slice(191, 260)
    trainer.update()
    path = tmp_path / "p.pt"
    checkpoint.save(path, trainer.state_dict())
    trainer.close()
    env = peregrine.make("prospector", num_envs=16, seed=5)
    actor = checkpoint.load_actor(path, env)
    # the same policy sampling as in training: masked too, and not just the mode
    sampler = checkpoint.Actor(actor.policy, env.single_action_space, actor.obs_normalizer,
                               actor.mask_slice, generator=torch.Generator().manual_seed(0))
    observations, _ = env.reset(seed=5)
    differs = 0
    for _ in range(100):
        actions = actor(observations)
        sampled = sampler(observations)
        valid = action_mask(observations)
        assert valid[np.arange(len(actions)), actions].all()
        assert valid[np.arange(len(sampled)), sampled].all()
        differs += int((sampled != actions).sum())
        observations, *_ = env.step(actions)
    assert differs > 0
    env.close()
