"""The native batch's less travelled inputs (another batch's Buffers, buffers that are
not arrays, a bool for a real-valued field) and the trainer's env-state helpers on
an env that cannot snapshot its instances."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import peregrine
from peregrine.envs.native.batch import BUFFER_NAMES
from peregrine.train import environment


def test_a_batch_can_run_on_another_batchs_buffers():
    """`buffers=` takes a Buffers (another batch's) as well as a mapping: the second
    batch writes into the very same arrays."""
    with peregrine.make("cartpole", num_envs=4, seed=0) as first:
        second = peregrine.make("cartpole", num_envs=4, seed=5, buffers=first.buffers)
        try:
            for name in BUFFER_NAMES:
                assert getattr(second.buffers, name) is getattr(first.buffers, name)
            observations, _ = second.reset(seed=5)
            assert observations is first.observations
            np.testing.assert_array_equal(first.observations, second.observations)
        finally:
            second.close()


def test_a_buffer_that_is_not_an_array_is_named():
    with peregrine.make("cartpole", num_envs=4, seed=0) as probe:
        good = {name: np.zeros_like(getattr(probe, name)) for name in BUFFER_NAMES}
    with pytest.raises(ValueError, match=r"buffers\['rewards'\] must be a NumPy array, got list"):
        peregrine.make("cartpole", num_envs=4, buffers=dict(good, rewards=[0.0] * 4))


@pytest.mark.parametrize("value", [True, np.bool_(False)])
def test_a_bool_for_a_real_valued_field_is_refused(value):
    with pytest.raises(ValueError, match=r"config field 'gravity' must be a number, got"):
        peregrine.make("cartpole", num_envs=2, gravity=value)


def test_a_bool_is_a_flags_value_only():
    """An integer field of [0, 1] takes a bool; any other integer field refuses it
    (max_steps=True was max_steps 1)."""
    with pytest.raises(ValueError, match=r"config field 'max_steps' must be a number, got True"):
        peregrine.make("cartpole", num_envs=2, max_steps=True)
    with peregrine.make("drone_swarm", num_envs=1, obs_report=True) as env:
        assert env.config["obs_report"] == 1


def test_repr_names_the_batch_shape():
    with peregrine.make("drone_swarm", num_envs=3, num_threads=2, seed=0) as env:
        assert repr(env) == (f"{type(env).__name__}(num_envs=3, agents_per_env="
                             f"{env.agents_per_env}, num_threads=2)")


class NoStreams:
    """A batch without seed_streams/get_state (e.g. an emulated Gymnasium env)."""
    num_envs = 2


def test_an_env_without_random_streams_cannot_be_snapshotted():
    env = NoStreams()
    assert not environment.supports_exact_resume(env)
    assert environment.reseed_streams(env, seed=1, update=3) is False
    assert environment.snapshot(env) is None


def test_restoring_a_snapshot_of_another_size_is_refused():
    with peregrine.make("cartpole", num_envs=3, seed=0) as env:
        states = environment.snapshot(env)
        assert states.shape[0] == 3 and states.dtype == torch.float64
        with peregrine.make("cartpole", num_envs=2, seed=0) as other:
            with pytest.raises(ValueError, match="env state for 3 instances but the env has "
                                                 "num_envs=2"):
                environment.restore(other, states)
        env.step(np.zeros(3, np.int32))
        environment.restore(env, states)     # the right size: back where it was
        np.testing.assert_array_equal(environment.snapshot(env).numpy(), states.numpy())
