"""The PPO loss over one minibatch, and its statistics as named fields.

* `evaluate_flat` / `evaluate_segments`: the policy's log-probs, entropies and
  values for a minibatch of samples (MLP) or of whole segments replayed from
  their saved LSTM state (recurrent policies), as an `Evaluation`.
* `ppo_loss`: clipped surrogate, optionally clipped value loss, entropy bonus,
  per-minibatch advantage normalisation, dead agents (`live` False) left out,
  plus the kickstarting term when a teacher is on; returns the scalar to
  minimise and, when asked, a `LossStats`.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from .kickstart import Kickstarter


class Evaluation(NamedTuple):
    logprobs: torch.Tensor
    entropy: torch.Tensor | None            # None when not asked for
    values: torch.Tensor
    live: torch.Tensor | None               # per-sample weights' mask (segments), or None
    teacher_logprobs: torch.Tensor | None   # log pi(teacher action), with a teacher


@dataclasses.dataclass
class LossStats:
    """One minibatch's loss statistics (tensors during learning, floats in records)."""
    policy_loss: torch.Tensor | float
    value_loss: torch.Tensor | float
    entropy: torch.Tensor | float
    approx_kl: torch.Tensor | float
    clip_fraction: torch.Tensor | float
    teacher_loss: torch.Tensor | float

    def stacked(self) -> torch.Tensor:
        """The fields as one tensor (summed over epochs, read back with one sync)."""
        return torch.stack([getattr(self, f.name) for f in dataclasses.fields(self)])

    @classmethod
    def from_stacked(cls, values: torch.Tensor) -> "LossStats":
        return cls(*values.tolist())


def evaluate_flat(policy, batch, entropy: bool = True) -> Evaluation:
    """An MLP policy on a minibatch of independent samples."""
    params, values, _ = policy.heads(batch["obs"], critic_states=batch.get("critic_states"))
    mask = batch.get("action_mask")
    logprobs, entropies = policy.log_prob_entropy(params, batch["actions"], entropy, mask)
    teacher = None
    if "teacher_actions" in batch:
        teacher, _ = policy.log_prob_entropy(params, batch["teacher_actions"], False, mask)
    return Evaluation(logprobs, entropies, values, None, teacher)


def evaluate_segments(policy, batch, entropy: bool = True) -> Evaluation:
    """A recurrent policy replayed over whole segments from their saved state
    (`Policy.replay`: the fused LSTM over every step at once); inputs and outputs
    are time-major, [length, segments]."""
    params, values = policy.replay(batch["obs"], (batch["h"], batch["c"]), batch["starts"],
                                   batch.get("critic_states"))
    shape, samples = values.shape, values.numel()

    def flat(x):  # [length, segments, ...] -> [samples, ...]: the distributions' layout
        return None if x is None else x.reshape(samples, *x.shape[2:])

    params, mask = flat(params), flat(batch.get("action_mask"))
    logprobs, entropies = policy.log_prob_entropy(params, flat(batch["actions"]), entropy, mask)
    teacher = None
    if "teacher_actions" in batch:
        teacher, _ = policy.log_prob_entropy(params, flat(batch["teacher_actions"]), False, mask)
        teacher = teacher.view(shape)
    return Evaluation(logprobs.view(shape), None if entropies is None else entropies.view(shape),
                      values, batch["live"], teacher)


def ppo_loss(evaluation: Evaluation, batch, t, teacher_weight: float = 0.0, record: bool = True):
    """(loss to minimise, LossStats or None) for a minibatch; `t` is the train config.
    Statistics are computed only with `record` (most minibatches do not record)."""
    logprobs, entropy, values, live, teacher_lp = evaluation
    log_ratio = logprobs - batch["logprobs"]
    ratio = log_ratio.exp()
    advantages = batch["advantages"]
    if live is not None:
        weight = live.float()
        denom = weight.sum().clamp(min=1.0)
        mean = lambda x: (x * weight).sum() / denom  # noqa: E731
    else:
        mean = torch.mean
    if t.norm_adv:
        if "advantage_stats" in batch:      # data-parallel: the global minibatch's (mean, std)
            average, std = batch["advantage_stats"]
            advantages = (advantages - average) / (std + 1e-8)
        elif live is not None:
            centred = advantages - mean(advantages)
            std = mean(centred.square()).sqrt()
            advantages = centred / (std + 1e-8)
        elif advantages.numel() > 1:
            std, average = torch.std_mean(advantages)
            advantages = (advantages - average) / (std + 1e-8)
    clipped_ratio = ratio.clamp(1.0 - t.clip_coef, 1.0 + t.clip_coef)
    policy_loss = -mean(torch.minimum(advantages * ratio, advantages * clipped_ratio))
    returns = batch["returns"]
    if t.clip_vloss:
        old = batch["values"]
        clipped_values = old + (values - old).clamp(-t.clip_coef, t.clip_coef)
        value_loss = 0.5 * mean(torch.maximum((values - returns).square(),
                                              (clipped_values - returns).square()))
    else:
        value_loss = 0.5 * mean((values - returns).square())
    loss = policy_loss + t.vf_coef * value_loss
    if t.ent_coef != 0:
        loss = loss - t.ent_coef * mean(entropy)
    teacher_loss = torch.zeros((), device=values.device)
    if teacher_lp is not None:
        teacher_loss = Kickstarter.loss(teacher_lp, batch, live)
        loss = loss + teacher_weight * teacher_loss
    if not record:
        return loss, None
    with torch.no_grad():
        return loss, LossStats(
            policy_loss=policy_loss.detach(), value_loss=value_loss.detach(),
            entropy=mean(entropy.detach()), approx_kl=mean((ratio - 1.0) - log_ratio),
            clip_fraction=mean(((ratio - 1.0).abs() > t.clip_coef).float()),
            teacher_loss=teacher_loss.detach())
