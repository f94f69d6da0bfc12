"""Kickstarting a recurrent policy: the teacher term is computed over the replayed
segments (loss.evaluate_segments), and the student learns the teacher's rule."""
from __future__ import annotations

from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer
from test_train_teacher import ArgmaxTeacher, RuleEnv


def test_a_recurrent_student_learns_the_teachers_rule():
    env = RuleEnv()
    config = load_config("cartpole", overrides=[
        ("vec.num_envs", env.num_envs), ("train.horizon", 16), ("train.minibatch_size", 128),
        ("train.update_epochs", 4), ("train.learning_rate", 3e-3), ("train.anneal_lr", False),
        ("train.ent_coef", 0.0), ("train.total_steps", 10_000),
        ("policy.lstm", True), ("policy.bptt_horizon", 8)])
    trainer = Trainer(config, env=env, teacher=ArgmaxTeacher())
    try:
        assert trainer.policy.use_lstm
        first = trainer.update()["losses"]["teacher_loss"]
        for _ in range(24):
            record = trainer.update()
        assert record["losses"]["teacher_weight"] == 1.0
        assert first > 1.2                            # ln 4 = 1.39 at chance
        assert record["losses"]["teacher_loss"] < 0.6
    finally:
        trainer.close()
