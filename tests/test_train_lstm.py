"""The recurrent policy's training replay (fused `nn.LSTM` over whole segments) computes
exactly what stepping the rollout's LSTM cell once per time step computes."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from gymnasium import spaces

from peregrine.train.config import PolicyConfig, TrainConfig
from peregrine.train.loss import Evaluation, evaluate_segments, ppo_loss
from peregrine.train.policy import Policy

SEGMENTS, LENGTH, OBS = 12, 10, 5


def make_policy(action_space, seed=0):
    torch.manual_seed(seed)
    config = PolicyConfig(lstm=True, lstm_size=16, hidden_size=24, num_layers=1)
    return Policy(spaces.Box(-1, 1, (OBS,), np.float32), action_space, config)


def make_batch(action_space, starts, seed=1):
    """A minibatch of segments as `RolloutStorage.segment_minibatches` yields it, with
    nonzero saved states (a zero state would hide a missed reset). Time-major:
    columns are [LENGTH, SEGMENTS, ...]."""
    generator = torch.Generator().manual_seed(seed)
    shape = (LENGTH, SEGMENTS)
    if isinstance(action_space, spaces.Discrete):
        actions = torch.randint(action_space.n, shape, generator=generator)
    else:
        actions = torch.randn(shape + action_space.shape, generator=generator)
    return {"obs": torch.randn(shape + (OBS,), generator=generator),
            "actions": actions,
            "h": torch.randn(SEGMENTS, 16, generator=generator),
            "c": torch.randn(SEGMENTS, 16, generator=generator),
            "starts": starts,
            "live": torch.ones(shape, dtype=torch.bool),
            "logprobs": -torch.rand(shape, generator=generator),
            "values": torch.randn(shape, generator=generator),
            "advantages": torch.randn(shape, generator=generator),
            "returns": torch.randn(shape, generator=generator)}


def cell_heads(policy, observations, state, starts):
    """One step as the per-step replay computed it before the fused LSTM: the
    encoder, then `torch.lstm_cell` on the LSTM's weights, then the heads."""
    keep = (~starts).unsqueeze(1).float()
    lstm = policy.lstm
    h, c = torch.lstm_cell(policy.encoder(observations), (state[0] * keep, state[1] * keep),
                           lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
    return policy.actor_head(h), policy.critic_head(h).squeeze(-1), (h, c)


def stepped(policy, batch, step) -> Evaluation:
    """The reference: `step` (the rollout's `Policy.heads`, or `cell_heads`) called
    once per time step, zeroing the state at each start."""
    state = (batch["h"], batch["c"])
    outputs = []
    for t in range(LENGTH):
        params, values, state = step(batch["obs"][t], state, batch["starts"][t])
        logprobs, entropy = policy.log_prob_entropy(params, batch["actions"][t])
        outputs.append((logprobs, entropy, values))
    logprobs, entropy, values = (torch.stack(x) for x in zip(*outputs))
    return Evaluation(logprobs, entropy, values, batch["live"], None)


REFERENCES = {"cell": lambda policy, batch: stepped(policy, batch, partial(cell_heads, policy)),
              "rollout": lambda policy, batch: stepped(policy, batch, policy.heads)}


def scattered_starts():
    """Episode starts inside segments, at step 0, two in one row, and rows with none."""
    starts = torch.zeros(LENGTH, SEGMENTS, dtype=torch.bool)
    starts[0, 0] = starts[3, 1] = starts[3, 2] = starts[7, 3] = True
    starts[2, 4] = starts[8, 4] = starts[LENGTH - 1, 5] = True
    return starts


@pytest.mark.parametrize("action_space", [spaces.Discrete(4),
                                          spaces.Box(-1, 1, (3,), np.float32)])
@pytest.mark.parametrize("starts_kind", ["scattered", "none", "every_step"])
@pytest.mark.parametrize("reference", sorted(REFERENCES))
def test_fused_replay_equals_the_cell_stepped_per_time_step(action_space, starts_kind, reference):
    """Same log-probs, entropies, values, loss and gradient of every parameter as the
    LSTM cell stepped per time step, and as the rollout's own step function."""
    starts = {"scattered": scattered_starts(),
              "none": torch.zeros(LENGTH, SEGMENTS, dtype=torch.bool),
              "every_step": torch.rand(LENGTH, SEGMENTS,
                                       generator=torch.Generator().manual_seed(3)) < 0.3}
    batch = make_batch(action_space, starts[starts_kind])
    train = TrainConfig(ent_coef=0.01, clip_vloss=True)
    results = []
    for evaluate in (evaluate_segments, REFERENCES[reference]):
        policy = make_policy(action_space)
        evaluation = evaluate(policy, batch)
        loss, _stats = ppo_loss(evaluation, batch, train)
        loss.backward()
        results.append((evaluation, loss, {name: p.grad for name, p in policy.named_parameters()}))
    (fused, fused_loss, fused_grads), (reference, reference_loss, reference_grads) = results
    for name in ("logprobs", "entropy", "values"):
        torch.testing.assert_close(getattr(fused, name), getattr(reference, name),
                                   rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(fused_loss, reference_loss, rtol=1e-5, atol=1e-6)
    assert fused_grads.keys() == reference_grads.keys()
    for name, grad in fused_grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_missed_reset_would_be_seen():
    """The equivalence test can fail: ignoring the starts changes the replay."""
    action_space = spaces.Discrete(4)
    batch = make_batch(action_space, scattered_starts())
    policy = make_policy(action_space)
    with torch.no_grad():
        reference = REFERENCES["cell"](policy, batch)
        _, no_resets = policy.replay(batch["obs"], (batch["h"], batch["c"]),
                                     torch.zeros_like(batch["starts"]))
    assert not torch.allclose(no_resets, reference.values, rtol=1e-3, atol=1e-4)


def test_replay_runs_one_fused_call_per_chunk_between_starts():
    """Chunks begin at step 0 and at each time index where any row starts: starts at
    steps {0, 2, 3, 7, 8, 9} over the minibatch make six calls, none make one."""
    action_space = spaces.Discrete(4)
    policy = make_policy(action_space)
    calls = []
    policy.lstm.register_forward_hook(lambda module, inputs, output: calls.append(
        inputs[0].shape[0]))
    for starts, expected in ((scattered_starts(), [2, 1, 4, 1, 1, 1]),
                             (torch.zeros(LENGTH, SEGMENTS, dtype=torch.bool), [LENGTH])):
        calls.clear()
        batch = make_batch(action_space, starts)
        with torch.no_grad():
            policy.replay(batch["obs"], (batch["h"], batch["c"]), batch["starts"])
        assert calls == expected


def test_checkpoints_with_the_old_cell_parameter_names_still_load():
    """Before the fused replay the core was an `nn.LSTMCell` (weight_ih, ..., no `_l0`):
    such a state dict loads into the same weights."""
    action_space = spaces.Discrete(4)
    trained = make_policy(action_space, seed=5)
    old = {name.replace("_l0", "") if name.startswith("lstm.") else name: tensor
           for name, tensor in trained.state_dict().items()}
    assert "lstm.weight_ih" in old and "lstm.weight_ih_l0" not in old
    loaded = make_policy(action_space, seed=6)
    loaded.load_state_dict(old)
    for name, tensor in trained.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    # The parameter order (which the optimizer state follows) is the cell's order.
    names = [name for name, _ in loaded.named_parameters() if name.startswith("lstm.")]
    assert names == ["lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0",
                     "lstm.bias_hh_l0"]
