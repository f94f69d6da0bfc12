"""The device-resident loop (vec.backend = "device") and bf16 precision, on the CPU.

The device path is the one a GPU env takes: the env's buffers are torch tensors on the
trainer's device and the rollout reads nothing back to the host. On the CPU the same
code runs against the C build stepping tensor memory, so these tests cover it:
it must learn exactly what the host path learns, resume exactly, and never
synchronise with the host inside a rollout (checked with a TorchFunctionMode that
refuses every operation that would).
"""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer

SMALL = [("vec.num_envs", 8), ("train.horizon", 16), ("train.minibatch_size", 64),
         ("train.update_epochs", 2), ("train.learning_rate", 3e-3),
         ("train.total_steps", 128 * 6), ("train.checkpoint_interval", 0),
         ("env.max_steps", 20)]                 # truncations inside every rollout


def config(env="cartpole", *extra):
    return load_config(env, overrides=SMALL + list(extra))


def run_updates(trainer, count):
    return [trainer.update()["losses"] for _ in range(count)]


def parameters(trainer):
    return [p.detach().clone() for p in trainer.policy.parameters()]


@pytest.mark.parametrize("env, lstm", [("cartpole", False), ("cartpole", True),
                                       ("pendulum", False), ("drone_swarm", False),
                                       ("prospector", False)])
def test_device_backend_learns_exactly_what_the_host_backend_learns(env, lstm):
    """Same seed: the same losses and parameters through the host pipeline (NumPy
    buffers) and the device pipeline (tensor buffers, masked truncation bootstrap), to
    float tolerance: the device path evaluates the bootstrap critic on every row and the
    host path on the cut rows only, and a matrix product's rounding may depend on its
    row count. Same episodes and actions throughout (the env is bit-identical)."""
    extra = [("policy.lstm", lstm), ("policy.bptt_horizon", 8), ("vec.num_envs", 4)]
    host = Trainer(config(env, *extra))
    device = Trainer(config(env, *extra, ("vec.backend", "device")))
    assert isinstance(device.env.observations, torch.Tensor)
    for expected, got in zip(run_updates(host, 3), run_updates(device, 3)):
        assert expected.keys() == got.keys()
        for key in expected:
            assert got[key] == pytest.approx(expected[key], rel=1e-3, abs=1e-6), key
    torch.testing.assert_close(host.storage.actions, device.storage.actions, rtol=0, atol=0)
    for a, b in zip(parameters(host), parameters(device)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    host.close()
    device.close()


def test_device_backend_resumes_exactly(tmp_path):
    extra = [("vec.backend", "device")]
    expected = run_updates(Trainer(config("cartpole", *extra)), 5)
    first = Trainer(config("cartpole", *extra))
    got = run_updates(first, 2)
    checkpoint.save(tmp_path / "ckpt.pt", first.state_dict())
    first.close()
    resumed = Trainer(config("cartpole", *extra))
    resumed.load_state_dict(checkpoint.load(tmp_path / "ckpt.pt"))
    assert got + run_updates(resumed, 3) == expected
    resumed.close()


class NoHostSync(TorchFunctionMode):
    """Refuses the torch operations that wait for a device or read its memory on the
    host: scalar reads, conversions, data-dependent shapes, boolean-mask indexing."""

    FORBIDDEN = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__",
                 "__index__", "__array__", "nonzero", "argwhere", "masked_select", "unique",
                 "unique_consecutive", "repeat_interleave", "equal", "allclose"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.FORBIDDEN:
            raise AssertionError(f"host synchronisation in the rollout: {name}")
        if name == "__getitem__" and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                raise AssertionError("host synchronisation in the rollout: boolean indexing")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("env, lstm", [("cartpole", False), ("cartpole", True),
                                       ("drone_swarm", False), ("prospector", False)])
def test_device_rollout_makes_no_host_sync(env, lstm):
    trainer = Trainer(config(env, ("vec.backend", "device"), ("policy.lstm", lstm),
                             ("policy.bptt_horizon", 8), ("env.max_steps", 10)))
    with NoHostSync():
        trainer.collect()
    ended = trainer.storage.dones.sum()
    assert ended > 0                           # episodes did end (and were bootstrapped)
    trainer.close()


def test_the_no_sync_check_catches_a_sync():
    """The check itself: a rollout that asks the device a question is refused."""
    trainer = Trainer(config("cartpole", ("vec.backend", "device")))
    bootstrap = trainer.pipeline.bootstrap

    def syncing_bootstrap(storage, step, value, gamma):
        if trainer.env.truncations.any():      # the host path's question, on the device
            bootstrap(storage, step, value, gamma)

    trainer.pipeline.bootstrap = syncing_bootstrap
    with pytest.raises(AssertionError, match="host synchronisation in the rollout: __bool__"):
        with NoHostSync():
            trainer.collect()
    trainer.close()


def test_device_backend_refuses_host_side_normalisers():
    with pytest.raises(ValueError, match="normalize_obs and train.normalize_reward are not "
                                         "available with vec.backend = 'device'"):
        Trainer(config("cartpole", ("vec.backend", "device"), ("train.normalize_obs", True)))


def test_bf16_trains_cartpole_to_the_solve_threshold():
    """autocast bf16 forward/backward on the CPU, fp32 weights and losses: the shipped
    config still solves CartPole (mean return >= 475) within its step budget."""
    from peregrine.train.run import train
    import tempfile
    cfg = load_config("cartpole", overrides=[("train.precision", "bf16"),
                                             ("train.tensorboard", False)])
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(cfg, run_dir + "/run")
    assert summary["stopped_at_return"], summary
    assert summary["recent_return"] >= 475


def test_bf16_runs_the_forward_in_bf16_and_keeps_fp32_weights():
    trainer = Trainer(config("cartpole", ("train.precision", "bf16")))
    seen = []
    trainer.policy.actor_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    losses = trainer.update()["losses"]
    assert torch.bfloat16 in seen
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())
    assert all(isinstance(v, float) for v in losses.values())
    assert trainer.storage.values.dtype == torch.float32
    trainer.close()
