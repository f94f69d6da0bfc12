"""Kickstarting: train.teacher adds -log pi(teacher action) to the PPO loss.

RuleEnv: observations are fresh Gaussian noise every step, reward is always
0, so PPO alone has nothing to learn; the only signal is the teacher, whose
rule is "the action of the largest of the first N observation columns".
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer
from toy_envs import ToyBatch

N = 4


class RuleEnv(ToyBatch):
    def __init__(self, num_envs=32, seed=0):
        super().__init__(num_envs, N, spaces.Discrete(N))
        self.rng = np.random.default_rng(seed)

    def reset(self, seed=None):
        self.observations[:] = self.rng.standard_normal(self.observations.shape)
        return self.observations, {}

    def step(self, actions):
        self.observations[:] = self.rng.standard_normal(self.observations.shape)
        return self.observations, self.rewards, self.terminals, self.truncations, {}


class ArgmaxTeacher:
    def __init__(self):
        self.calls = 0

    def __call__(self, observations):
        self.calls += 1
        return observations[:, :N].argmax(axis=1)


def make_trainer(env, teacher=None, **train):
    overrides = [("vec.num_envs", env.num_envs), ("train.horizon", 16),
                 ("train.minibatch_size", 128), ("train.update_epochs", 4),
                 ("train.learning_rate", 3e-3), ("train.anneal_lr", False),
                 ("train.ent_coef", 0.0), ("train.total_steps", 10_000)]
    overrides += [(f"train.{k}", v) for k, v in train.items()]
    return Trainer(load_config("cartpole", overrides=overrides), env=env, teacher=teacher)


def agreement(trainer, rows=2000):
    obs = torch.from_numpy(np.random.default_rng(7).standard_normal((rows, N)).astype(np.float32))
    with torch.no_grad():
        params, _, _ = trainer.policy.heads(obs)
    return float((params.argmax(1) == obs.argmax(1)).float().mean())


def test_student_learns_the_teachers_rule_and_plain_ppo_does_not():
    taught = make_trainer(RuleEnv(), ArgmaxTeacher())
    plain = make_trainer(RuleEnv())
    for _ in range(25):
        record = taught.update()
        plain.update()
    assert record["losses"]["teacher_weight"] == 1.0
    assert record["losses"]["teacher_loss"] < 0.5          # ln 4 = 1.39 at chance
    assert agreement(taught) > 0.9
    assert agreement(plain) < 0.5                           # chance is 0.25
    assert "teacher_loss" not in plain.update()["losses"]


def test_weight_decays_linearly_and_the_teacher_is_dropped_after_teacher_steps():
    teacher = ArgmaxTeacher()
    trainer = make_trainer(RuleEnv(), teacher, teacher_coef=2.0, teacher_steps=4 * 512)
    weights = []
    for _ in range(6):
        calls = teacher.calls
        record = trainer.update()
        weights.append(record["losses"]["teacher_weight"])
        assert teacher.calls - calls == (16 if weights[-1] > 0 else 0)   # one call per step
        assert ("teacher_loss" in record["losses"]) == (weights[-1] > 0)
    assert weights == pytest.approx([2.0, 1.5, 1.0, 0.5, 0.0, 0.0])


def trader_states(steps=150, num_envs=16):
    """Observations the scripted trader visits, and its actions there."""
    import peregrine
    from peregrine.envs.prospector.scripted import ScriptedTrader
    env = peregrine.make("prospector", num_envs=num_envs, seed=3)
    trader = ScriptedTrader()
    observations, _ = env.reset()
    seen, actions = [], []
    for _ in range(steps):
        seen.append(observations.copy())
        actions.append(trader(observations))
        observations = env.step(actions[-1])[0]
    env.close()
    return torch.from_numpy(np.concatenate(seen)), torch.from_numpy(np.concatenate(actions))


def test_scripted_teacher_by_name_on_prospector():
    """The shipped use: Prospector's scripted trader, named in the config. The
    student's masked argmax agrees with the trader on states the trader visits
    far more often after a few updates than at initialisation."""
    from peregrine.envs.prospector import Prospector
    config = load_config("prospector", overrides=[
        ("vec.num_envs", 32), ("train.horizon", 32), ("train.minibatch_size", 256),
        ("train.total_steps", 32 * 32 * 12), ("train.teacher", "trader"),
        ("train.learning_rate", 2e-3), ("train.ent_coef", 0.0)])
    trainer = Trainer(config)
    states, chosen = trader_states()
    mask = states[:, Prospector.action_mask_slice] > 0.5

    def agrees():
        with torch.no_grad():
            params, _, _ = trainer.policy.heads(states)
        return float((trainer.policy.deterministic(params, mask) == chosen).float().mean())

    before = agrees()
    losses = [trainer.update()["losses"]["teacher_loss"] for _ in range(12)]
    after = agrees()
    trainer.close()
    assert all(np.isfinite(losses))
    assert after > 0.35 and after > before + 0.25, (before, after)


class FirstActionTeacher:
    """Always action 0, which the mask often forbids."""

    def __call__(self, observations):
        return np.zeros(len(observations), np.int64)


def test_teacher_actions_the_mask_forbids_are_left_out():
    from test_train_masking import MaskEnv
    env = MaskEnv(num_envs=16)
    trainer = Trainer(load_config("cartpole", overrides=[
        ("vec.num_envs", 16), ("train.horizon", 16), ("train.minibatch_size", 64),
        ("train.total_steps", 10_000)]), env=env, teacher=FirstActionTeacher())
    for _ in range(3):
        losses = trainer.update()["losses"]
        assert np.isfinite(losses["teacher_loss"]) and losses["teacher_loss"] < 50
        assert all(np.isfinite(v) for v in losses.values())
    assert env.invalid_taken == 0


def test_bad_teachers_are_refused():
    with pytest.raises(ValueError, match="unknown policy 'no_such_policy'"):
        Trainer(load_config("cartpole", overrides=[("train.teacher", "no_such_policy")]))
    for key in ("train.teacher_coef", "train.teacher_steps"):
        with pytest.raises(ValueError, match=key):
            load_config("cartpole", overrides=[(key, -1)])
    trainer = make_trainer(RuleEnv(), lambda obs: np.zeros((len(obs), 2), np.int64))
    with pytest.raises(ValueError, match="teacher policy returned actions of shape"):
        trainer.update()
    # 0.9 was floored to action 0 (the same loss as an all-0 teacher), and 5 indexed past
    # the logits deep in torch
    for value, message in ((0.9, "actions of Discrete.4. must be integers, got dtype float64"),
                           (5, "action 5 at \\(0,\\) is outside Discrete")):
        trainer = make_trainer(RuleEnv(), lambda obs, value=value: np.full(len(obs), value))
        with pytest.raises(ValueError, match="teacher policy returned " + message):
            trainer.update()


def test_resume_with_a_teacher_continues_exactly(tmp_path):
    config = load_config("prospector", overrides=[
        ("vec.num_envs", 8), ("train.horizon", 16), ("train.minibatch_size", 64),
        ("train.total_steps", 8 * 16 * 4), ("train.teacher", "trader"),
        ("train.teacher_steps", 8 * 16 * 3)])
    uninterrupted = Trainer(config)
    expected = [uninterrupted.update()["losses"] for _ in range(4)]
    first = Trainer(config)
    got = [first.update()["losses"] for _ in range(2)]
    checkpoint.save(tmp_path / "ckpt.pt", first.state_dict())
    first.close()
    resumed = Trainer(config)
    resumed.load_state_dict(checkpoint.load(tmp_path / "ckpt.pt"))
    got += [resumed.update()["losses"] for _ in range(2)]
    assert got == expected
    assert [x["teacher_weight"] for x in got] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    uninterrupted.close()
    resumed.close()
