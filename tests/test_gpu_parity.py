"""The device path at scale: what the GPU acceptance's stage (a) runs on a GPU.

Every test runs on the device named by PEREGRINE_TEST_DEVICE, else "cuda" where
torch sees a GPU, else "cpu". On a GPU the sizes are the acceptance's (4,096
instances x 1,000 steps per env); on the CPU they are small, so the suite keeps
every line of this file running between GPU sessions. A device named in the
variable but absent is an error, never a skip: the acceptance sets
PEREGRINE_TEST_DEVICE=cuda so that a machine whose GPU is not seen fails loudly.

* parity: the device batch against the C batch (NumPy buffers, the CPU build of
  the same header), bit for bit, every buffer after every step, through
  truncations, terminals, a reseeding reset, states moved between instances with
  get_state/set_state; per-instance statistics and the states at the end;
* the device training loop's rollout makes no host synchronisation (the
  TorchFunctionMode check of test_train_device.py and, on CUDA, torch's own
  sync debug mode set to error);
* CUDA graphs: the env step captured and replayed equals eager steps; a
  train.compile update (mode "reduce-overhead", CUDA graphs) matches eager;
* bf16: the device loop's forward runs in bf16, weights stay fp32, losses finite.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import peregrine
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer
from test_train_device import NoHostSync

DEVICE = torch.device(os.environ.get("PEREGRINE_TEST_DEVICE")
                      or ("cuda" if torch.cuda.is_available() else "cpu"))
ON_GPU = DEVICE.type == "cuda"
# The acceptance's scale on a GPU; small on the CPU (the C batch is the reference on
# both, so there the check is the device class's contract, not the GPU build).
NUM_ENVS = 4096 if ON_GPU else 40
STEPS = 1000 if ON_GPU else 90
ENVS = peregrine.list_envs()
SHORT = {"max_steps": 17}      # truncations every 17 steps (terminals from random actions)
needs_cuda = pytest.mark.skipif(not ON_GPU, reason="CUDA graphs exist only on a CUDA device "
                                                   f"(this run's device is {DEVICE})")


def action_batch(env, rng):
    space = env.single_action_space
    if hasattr(space, "n"):
        return rng.integers(0, space.n, env.num_agents).astype(np.int32)
    if hasattr(space, "nvec"):
        return rng.integers(0, space.nvec, (env.num_agents, len(space.nvec))).astype(np.int32)
    return rng.uniform(-1.5, 1.5, (env.num_agents, *space.shape)).astype(np.float32)


BUFFERS = ("observations", "rewards", "terminals", "truncations", "final_observations", "masks")


def assert_buffers_equal(reference, device_env, step):
    for name in BUFFERS:
        mine = getattr(device_env, name).cpu().numpy()
        np.testing.assert_array_equal(getattr(reference, name), mine,
                                      err_msg=f"{name} after step {step}")


@pytest.mark.parametrize("name", ENVS)
def test_device_batch_is_bit_identical_to_the_c_batch_at_scale(name):
    threads = min(os.cpu_count() or 1, 16)
    reference = peregrine.make(name, num_envs=NUM_ENVS, seed=7, num_threads=threads, **SHORT)
    device_env = peregrine.make(name, num_envs=NUM_ENVS, seed=7, device=DEVICE, **SHORT)
    assert_buffers_equal(reference, device_env, "reset")
    rng = np.random.default_rng(3)
    ended = {"terminals": 0, "truncations": 0}
    moved_at, reseed_at = STEPS // 3, (2 * STEPS) // 3
    for step in range(STEPS):
        if step == moved_at:
            # States travel between instances on both batches: the last instance
            # takes the first one's state, the middle one the last one's.
            first, middle, last = 0, NUM_ENVS // 2, NUM_ENVS - 1
            np.testing.assert_array_equal(reference.get_state(first), device_env.get_state(first))
            for source, target in ((first, last), (last, middle)):
                state = reference.get_state(source)
                reference.set_state(target, state)
                device_env.set_state(target, state)
            assert_buffers_equal(reference, device_env, f"{step} (states moved)")
        if step == reseed_at:
            reference.reset(seed=11)
            device_env.reset(seed=11)
            assert_buffers_equal(reference, device_env, f"{step} (reseeded)")
        actions = action_batch(reference, rng)
        reference.step(actions)
        device_env.step(torch.from_numpy(actions).to(DEVICE))
        assert_buffers_equal(reference, device_env, step)
        for flag in ended:
            ended[flag] += int(getattr(reference, flag).sum())
    assert ended["truncations"] > 0
    device_env.check()                          # no action was repaired: all were valid
    expected_episodes, expected_sums = reference.instance_stats(clear=False)
    episodes, sums = device_env.instance_stats(clear=False)
    np.testing.assert_array_equal(expected_episodes, episodes.cpu().numpy())
    np.testing.assert_array_equal(expected_sums, sums.cpu().numpy())
    expected, got = reference.episode_stats(), device_env.episode_stats()
    assert got.count == expected.count > 0
    for statistic in expected.mean:      # summed in another order on the device: last bits
        assert got.mean[statistic] == pytest.approx(expected.mean[statistic], rel=1e-9, abs=1e-12)
    states = device_env.get_states()
    for instance in range(0, NUM_ENVS, max(1, NUM_ENVS // 64)):
        np.testing.assert_array_equal(reference.get_state(instance), states[instance])
    reference.close()
    device_env.close()


def test_global_states_on_the_device_equal_the_c_batch():
    """DroneSwarm's global state (the centralised critic's input) written by the
    device batch's pg_states pass: bit-identical to the C batch's, final states of
    ended episodes included, at the acceptance's scale on a GPU; with every optional
    observation column (the neighbour slots read a scratch row on the GPU), the
    observations too."""
    obstacles = {**SHORT, "preset": "wilderness_obstacles_hard", "obs_report": 1,
                 "obs_network": 1, "obs_drone_id": 1, "obs_n_neighbours": 3}
    reference = peregrine.make("drone_swarm", num_envs=NUM_ENVS, seed=5, **obstacles)
    device_env = peregrine.make("drone_swarm", num_envs=NUM_ENVS, seed=5, device=DEVICE,
                                **obstacles)
    reference.enable_states()
    states = device_env.enable_states()
    assert states.device.type == DEVICE.type
    rng = np.random.default_rng(4)
    for step in range(min(STEPS, 200)):
        actions = action_batch(reference, rng)
        reference.step(actions)
        device_env.step(torch.from_numpy(actions).to(DEVICE))
        np.testing.assert_array_equal(reference.states, states.cpu().numpy(),
                                      err_msg=f"states after step {step}")
        np.testing.assert_array_equal(reference.final_states,
                                      device_env.final_states.cpu().numpy(),
                                      err_msg=f"final states after step {step}")
        np.testing.assert_array_equal(reference.observations,
                                      device_env.observations.cpu().numpy(),
                                      err_msg=f"observations after step {step}")
    reference.close()
    device_env.close()


def test_bad_actions_are_repaired_alike_on_the_device():
    """Out-of-range discrete actions become 0 on the device, counted by check()."""
    env = peregrine.make("cartpole", num_envs=NUM_ENVS, seed=0, device=DEVICE)
    twin = peregrine.make("cartpole", num_envs=NUM_ENVS, seed=0)
    actions = np.ones(NUM_ENVS, np.int32)
    actions[::3] = 7
    env.step(torch.from_numpy(actions).to(DEVICE))
    repaired = actions.copy()
    repaired[::3] = 0
    twin.step(repaired)
    np.testing.assert_array_equal(env.observations.cpu().numpy(), twin.observations)
    with pytest.raises(ValueError, match=f"{len(actions[::3])} out-of-range discrete"):
        env.check()
    env.close()
    twin.close()


# ---- the device training loop -----------------------------------------------------------

def device_config(env, *extra):
    rows = 256 if ON_GPU else 8
    return load_config(env, overrides=[
        ("vec.backend", "device"), ("train.device", str(DEVICE)), ("vec.num_envs", rows),
        ("train.horizon", 16), ("train.minibatch_size", rows * 4), ("train.update_epochs", 1),
        ("train.checkpoint_interval", 0), ("env.max_steps", 12), *extra])


class SyncDebugError:
    """On CUDA, torch's own detector: any synchronising torch call raises."""

    def __enter__(self):
        if ON_GPU:
            self.previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        if ON_GPU:
            torch.cuda.set_sync_debug_mode(self.previous)


@pytest.mark.parametrize("env, precision", [("cartpole", "fp32"), ("drone_swarm", "fp32"),
                                            ("cartpole", "bf16"), ("prospector", "fp32")])
def test_device_rollout_makes_no_host_sync(env, precision):
    trainer = Trainer(device_config(env, ("train.precision", precision)))
    assert trainer.env.observations.device.type == DEVICE.type
    trainer.collect()                           # first rollout: lazy set-up may sync
    with NoHostSync(), SyncDebugError():
        trainer.collect()
    assert trainer.storage.dones.sum() > 0     # episodes ended inside the rollout
    trainer.close()


def test_bf16_forward_on_the_device_loop_keeps_fp32_weights_and_finite_losses():
    trainer = Trainer(device_config("cartpole", ("train.precision", "bf16")))
    seen = []
    trainer.policy.actor_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    for _ in range(2):
        losses = trainer.update()["losses"]
        assert all(np.isfinite(value) for value in losses.values()), losses
    assert torch.bfloat16 in seen
    assert all(p.dtype == torch.float32 and p.device.type == DEVICE.type
               for p in trainer.policy.parameters())
    trainer.close()


# ---- CUDA graphs -----------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("name", ["cartpole", "drone_swarm"])
def test_env_step_captured_in_a_cuda_graph_replays_as_eager_steps(name):
    env = peregrine.make(name, num_envs=NUM_ENVS, seed=0, device=DEVICE, **SHORT)
    twin = peregrine.make(name, num_envs=NUM_ENVS, seed=0, device=DEVICE, **SHORT)
    actions = torch.from_numpy(action_batch(env, np.random.default_rng(0))).to(DEVICE)
    env.actions.copy_(actions)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        env.step(env.actions)                   # warm-up on the capture stream
        twin.step(actions)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):   # raises on any sync
            env.step(env.actions)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(40):                         # past max_steps: resets inside replays
        graph.replay()
        twin.step(actions)
    torch.cuda.synchronize()
    for buffer in BUFFERS:
        assert torch.equal(getattr(env, buffer), getattr(twin, buffer)), buffer
    episodes, _ = env.instance_stats()
    assert int(episodes.sum()) > 0
    env.close()
    twin.close()


@needs_cuda
def test_compiled_update_with_cuda_graphs_matches_eager():
    """train.compile on CUDA (mode "reduce-overhead": the rollout step and the loss
    replayed as CUDA graphs): one update takes the eager trainer's actions (the same
    draws from the same generator) and gives its losses to float tolerance, as
    test_train_compile.py checks on the CPU."""
    eager = Trainer(device_config("cartpole"))
    compiled = Trainer(device_config("cartpole", ("train.compile", True)))
    assert compiled.compiled                  # compiled, not the eager fallback
    expected, got = eager.update()["losses"], compiled.update()["losses"]
    torch.testing.assert_close(compiled.storage.actions, eager.storage.actions, rtol=0, atol=0)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-3, abs=1e-5), key
    eager.close()
    compiled.close()
