"""Checkpoints whose header is sound but whose content is not, and the actor a
checkpoint loads as: one observation, recurrent state per row."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

import peregrine
from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer

SMALL = [("vec.num_envs", 4), ("train.horizon", 8), ("train.minibatch_size", 32),
         ("train.update_epochs", 1), ("train.total_steps", 64)]


def trained_payload(*extra):
    trainer = Trainer(load_config("cartpole", overrides=SMALL + list(extra)))
    trainer.update()
    payload = trainer.state_dict()
    trainer.close()
    return payload


@pytest.fixture(scope="module")
def payload():
    return trained_payload()


def write_raw(path, data: bytes):
    """`data` behind a valid header: length and checksum match, the content is whatever it is."""
    path.write_bytes(checkpoint.HEADER.pack(checkpoint.MAGIC, len(data),
                                            hashlib.sha256(data).digest()) + data)
    return path


def test_a_sound_header_over_undecodable_bytes_is_refused(tmp_path):
    path = write_raw(tmp_path / "garbage.pt", b"not a torch file at all" * 10)
    with pytest.raises(ValueError, match=r"garbage.pt' could not be decoded"):
        checkpoint.load(path)


def test_another_format_version_is_refused(tmp_path):
    path = tmp_path / "future.pt"
    checkpoint.save(path, {"format_version": 99, "policy": {}})
    with pytest.raises(ValueError, match="unsupported format version 99"):
        checkpoint.load(path)
    import io
    buffer = io.BytesIO()
    torch.save([1, 2, 3], buffer)          # decodes, but is not a dict at all
    write_raw(path, buffer.getvalue())
    with pytest.raises(ValueError, match="unsupported format version None"):
        checkpoint.load(path)


@pytest.mark.parametrize("key", ["policy", "config", "observation_space", "action_space"])
def test_a_payload_without_a_training_entry_is_not_a_training_checkpoint(tmp_path, payload, key):
    path = tmp_path / "partial.pt"
    checkpoint.save(path, {k: v for k, v in payload.items() if k != key})
    env = peregrine.make("cartpole", num_envs=2)
    with pytest.raises(ValueError, match=f"has no '{key}' entry; it is not a training checkpoint"):
        checkpoint.load_actor(path, env)
    env.close()


def test_weights_that_do_not_fit_the_policy_config_are_refused(tmp_path, payload):
    bad = dict(payload, config={**payload["config"],
                                "policy": {**payload["config"]["policy"], "hidden_size": 32}})
    checkpoint.save(tmp_path / "resized.pt", bad)
    env = peregrine.make("cartpole", num_envs=2)
    with pytest.raises(ValueError, match="does not match its policy config"):
        checkpoint.load_actor(tmp_path / "resized.pt", env)
    env.close()


def test_a_malformed_observation_normaliser_is_refused(tmp_path, payload):
    checkpoint.save(tmp_path / "norm.pt", dict(payload, obs_normalizer={"mean": torch.zeros(4)}))
    env = peregrine.make("cartpole", num_envs=2)
    with pytest.raises(ValueError, match="malformed observation normaliser"):
        checkpoint.load_actor(tmp_path / "norm.pt", env)
    env.close()


def test_make_trained_env_needs_the_checkpoint_to_record_its_env(tmp_path, payload):
    config = {k: v for k, v in payload["config"].items() if k != "env"}
    checkpoint.save(tmp_path / "anonymous.pt", dict(payload, config=config))
    assert checkpoint.env_kwargs(tmp_path / "anonymous.pt") == (None, {})
    with pytest.raises(ValueError, match="records no env config: make the env yourself"):
        checkpoint.make_trained_env(tmp_path / "anonymous.pt")


def test_one_observation_gives_one_action(tmp_path, payload):
    checkpoint.save(tmp_path / "latest.pt", payload)
    env = peregrine.make("cartpole", num_envs=6, seed=2)
    actor = checkpoint.load_actor(tmp_path / "latest.pt", env)
    observations, _ = env.reset(seed=2)
    batch = actor(observations)
    for row in range(6):
        single = actor(observations[row])
        assert single.shape == (1,) and single[0] == batch[row]
    env.close()


def test_a_recurrent_actor_keeps_state_per_row_and_resets_where_episodes_begin(tmp_path):
    checkpoint.save(tmp_path / "lstm.pt", trained_payload(("policy.lstm", True),
                                                          ("policy.bptt_horizon", 4)))
    env = peregrine.make("cartpole", num_envs=3, seed=0)
    actor = checkpoint.load_actor(tmp_path / "lstm.pt", env)
    assert actor.policy.use_lstm
    observations, _ = env.reset(seed=0)
    first = actor(observations)
    state_after_one = [s.clone() for s in actor.state]
    assert actor.state[0].shape[0] == 3
    actor(observations)
    assert not all(torch.equal(a, b) for a, b in zip(actor.state, state_after_one))  # it carries state
    # every row's episode began: the next call starts from a zero state again
    actor.observe_done(np.ones(3, bool), np.zeros(3, bool))
    np.testing.assert_array_equal(actor(observations), first)
    assert all(torch.equal(a, b) for a, b in zip(actor.state, state_after_one))
    # reset() forgets the state; another row count gets a state of its own size
    actor.reset()
    assert actor.state is None
    np.testing.assert_array_equal(actor(observations), first)
    np.testing.assert_array_equal(actor(observations[:1]), first[:1])
    env.close()
