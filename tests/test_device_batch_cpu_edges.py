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


# DroneSwarm's default preset holds 3,109 bytes an instance (2026-11-27: 1,741 in its
# state arrays, 910 of them the GPU's scratch rows, and 1,368 in its buffers); on an H200
# 1,048,576 instances took 3,220 MiB over the CUDA context (RESULTS, "GPU third light").
# The bound keeps a regression like the step kernel's old 39 KB stack from returning
# unseen as state.
DRONE_SWARM_BYTES_PER_INSTANCE = 3200


def test_nbytes_is_every_array_and_buffer_and_grows_linearly():
    """nbytes sums the env's pg_alloc arrays (from the binding's layout), its buffers
    and the action-error counters; the global states count once enabled; a small
    batch's nbytes per instance sizes a large one."""
    from peregrine.envs.gpu.batch import ACTION_ERRORS, BUFFER_NAMES
    sizes = {}
    for num_envs in (64, 256):
        with peregrine.make("drone_swarm", num_envs=num_envs, seed=0, device="cpu") as env:
            layout = env.host._batch.layout()
            arrays = sum(nbytes for _, nbytes in layout["allocations"])
            buffers = sum(env.buffers[name].nbytes for name in BUFFER_NAMES)
            assert env.nbytes == arrays + buffers + env.action_errors.nbytes
            assert env.observations.nbytes + env.final_observations.nbytes <= buffers
            before = env.nbytes
            env.enable_states()
            assert env.nbytes == before + 2 * num_envs * env.state_dim * 4
            sizes[num_envs] = before
    per_instance = (sizes[256] - sizes[64]) / 192
    # linear: the same fixed part (the action-error counters only) at both sizes
    assert sizes[64] - 64 * per_instance == sizes[256] - 256 * per_instance == 8 * len(ACTION_ERRORS)
    assert per_instance <= DRONE_SWARM_BYTES_PER_INSTANCE, per_instance
    with peregrine.make("cartpole", num_envs=1000, seed=0, device="cpu") as env:
        assert env.nbytes < 1000 * 200      # 4 floats of state and observation, flags, streams
