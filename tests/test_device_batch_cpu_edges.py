"""The device batch on device="cpu" (torch-tensor buffers, the CPU kernels): statistics
read without clearing, devices it does not run on, and its context manager and repr."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import peregrine  # noqa: E402


def run_until_episodes_end(env):
    import torch
    actions = torch.zeros(env.num_agents, dtype=torch.int32)
    for _ in range(500):
        env.step(actions)
        if env.instance_stats(clear=False)[0].sum() >= env.num_envs:
            return
    raise AssertionError("no episodes ended")


def test_statistics_read_without_clearing_stay_and_a_clearing_read_empties_them():
    with peregrine.make("cartpole", num_envs=3, seed=0, device="cpu") as env:
        run_until_episodes_end(env)
        episodes, sums = env.instance_stats(clear=False)
        peek = env.episode_stats(clear=False)
        assert peek.count == int(episodes.sum()) >= 3
        again = env.episode_stats(clear=False)
        assert again.count == peek.count and again.mean == peek.mean
        episodes_again, sums_again = env.instance_stats(clear=True)
        assert episodes_again.tolist() == episodes.tolist()
        np.testing.assert_array_equal(sums_again.numpy(), sums.numpy())
        assert env.episode_stats().count == 0


@pytest.mark.parametrize("device", ["meta", "xpu"])
def test_a_device_it_does_not_run_on_is_named(device):
    with pytest.raises(ValueError, match=f"device must be 'cpu', 'cuda' or 'cuda:N', got '{device}'"):
        peregrine.make("cartpole", num_envs=2, device=device)


def test_an_unknown_device_string_is_named():
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu0'"):
        peregrine.make("cartpole", num_envs=2, device="gpu0")


def test_context_manager_closes_and_repr_names_the_batch():
    with peregrine.make("drone_swarm", num_envs=2, seed=0, device="cpu") as env:
        assert repr(env) == (f"DeviceEnv('drone_swarm', num_envs=2, agents_per_env="
                             f"{env.agents_per_env}, device='cpu')")
    with pytest.raises(RuntimeError):
        env.episode_stats()
