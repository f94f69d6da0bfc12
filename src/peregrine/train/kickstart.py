"""Kickstarting (`train.teacher`): a teacher policy's actions as an auxiliary target.

A teacher (a scripted baseline such as Prospector's "trader", a checkpoint,
or any callable(observations) -> actions) labels every observation the
*student* visits with its own action; the loss gains
`w * -log pi(teacher action)`, w decaying linearly from `train.teacher_coef`
to 0 over `train.teacher_steps` (constant when 0). The student still acts, so
the PPO terms stay on-policy; once w reaches 0 the teacher is no longer
called and the run is plain PPO. Samples whose teacher action the mask calls
invalid, and dead agents, are left out of the term.
"""
from __future__ import annotations

import numpy as np
import torch

from ..envs.scripted import resolve_policy
from ..vector.export import check_action_range, check_integer_actions


class Kickstarter:
    def __init__(self, teacher, config, env):
        t = config.train
        self.coef, self.steps = t.teacher_coef, t.teacher_steps
        self.space = env.single_action_space
        from .checkpoint import load_actor
        self.policy = resolve_policy(config.env_name, teacher, env, t.seed,
                                     lambda path: load_actor(path, env))

    def weight(self, global_step: int) -> float:
        """The teacher term's weight at `global_step`."""
        if self.steps <= 0:
            return self.coef
        return self.coef * max(0.0, 1.0 - global_step / self.steps)

    def label(self, raw_observations: torch.Tensor, out: torch.Tensor) -> None:
        """The teacher's actions for the current raw observations, into `out`."""
        actions = np.asarray(self.policy(raw_observations.numpy()))
        if actions.shape != tuple(out.shape):
            raise ValueError(f"the teacher policy returned actions of shape {actions.shape}; "
                             f"the env's batch needs {tuple(out.shape)}")
        try:    # copy_ below would floor 0.9 to action 0 and index past the logits with 5
            check_integer_actions(self.space, actions)
            check_action_range(self.space, actions)
        except ValueError as error:
            raise ValueError(f"the teacher policy returned {error}") from None
        out.copy_(torch.from_numpy(actions))   # copy_ converts the dtype

    @staticmethod
    def loss(teacher_logprobs, batch, live):
        """Mean -log pi(teacher action) over live samples whose teacher action is valid."""
        weight = torch.ones_like(teacher_logprobs)
        mask = batch.get("action_mask")
        if mask is not None:   # a forbidden action's log-prob is ~-1e9: finite, weighted 0
            chosen = batch["teacher_actions"].long().unsqueeze(-1)
            weight = weight * mask.gather(-1, chosen).squeeze(-1)
        if live is not None:
            weight = weight * live
        return -(teacher_logprobs * weight).sum() / weight.sum().clamp(min=1.0)
