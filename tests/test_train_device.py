"""The device-resident loop (vec.backend = "device") and bf16 precision, on the CPU.

The device path is the one a GPU env takes: the env's buffers are torch tensors on the
trainer's device and the rollout reads nothing back to the host. On the CPU the same
code runs against the C build stepping tensor memory, so these tests cover it:
it must learn exactly what the host path learns, resume exactly, and never
synchronise with the host inside a rollout (checked with a TorchFunctionMode that
refuses every operation that would), with or without the running normalisers
(train.normalize_obs / normalize_reward), whose statistics then live on the device.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.overrides import TorchFunctionMode

from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer
from toy_envs import ToyBatch

SMALL = [("vec.num_envs", 8), ("train.horizon", 16), ("train.minibatch_size", 64),
         ("train.update_epochs", 2), ("train.learning_rate", 3e-3),
         ("train.total_steps", 128 * 6), ("train.checkpoint_interval", 0),
         ("env.max_steps", 20)]                 # truncations inside every rollout


def config(env="cartpole", *extra):
    return load_config(env, overrides=SMALL + list(extra))


NORMALISED = [("train.normalize_obs", True), ("train.normalize_reward", True)]


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


@pytest.mark.parametrize("normalised", [False, True])
def test_device_backend_resumes_exactly(tmp_path, normalised):
    """Stop after 2 updates, save, resume, run 3 more: the losses, parameters and
    (normalised) the device-resident statistics equal an uninterrupted run's."""
    extra = [("vec.backend", "device")] + (NORMALISED if normalised else [])
    uninterrupted = Trainer(config("cartpole", *extra))
    expected = run_updates(uninterrupted, 5)
    first = Trainer(config("cartpole", *extra))
    got = run_updates(first, 2)
    checkpoint.save(tmp_path / "ckpt.pt", first.state_dict())
    first.close()
    resumed = Trainer(config("cartpole", *extra))
    resumed.load_state_dict(checkpoint.load(tmp_path / "ckpt.pt"))
    assert got + run_updates(resumed, 3) == expected
    for a, b in zip(parameters(resumed), parameters(uninterrupted)):
        assert torch.equal(a, b)
    if normalised:
        mine, theirs = resumed.pipeline.state_dict(), uninterrupted.pipeline.state_dict()
        for name in ("obs_normalizer", "reward_scaler"):
            assert mine[name]["count"] == theirs[name]["count"] > 0
            for key in mine[name]:
                assert np.array_equal(mine[name][key], theirs[name][key]), (name, key)
    uninterrupted.close()
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


@pytest.mark.parametrize("env, lstm, normalised", [
    ("cartpole", False, False), ("cartpole", True, False), ("drone_swarm", False, False),
    ("prospector", False, False), ("cartpole", False, True), ("cartpole", True, True),
    ("drone_swarm", False, True), ("prospector", False, True)])
def test_device_rollout_makes_no_host_sync(env, lstm, normalised):
    trainer = Trainer(config(env, ("vec.backend", "device"), ("policy.lstm", lstm),
                             ("policy.bptt_horizon", 8), ("env.max_steps", 10),
                             *(NORMALISED if normalised else [])))
    with NoHostSync():
        trainer.collect()
    ended = trainer.storage.dones.sum()
    assert ended > 0                           # episodes did end (and were bootstrapped)
    if normalised:                             # the statistics did take in the rollout
        state = trainer.pipeline.state_dict()
        assert state["reward_scaler"]["count"] == trainer.batch_size
        assert state["obs_normalizer"]["count"] == trainer.batch_size + trainer.rows
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


# ---- running normalisers on the device ------------------------------------------

@pytest.mark.parametrize("env", ["cartpole", "drone_swarm"])
def test_device_normalisers_equal_the_host_ones(env):
    """Same seed, same episodes: the device-resident statistics equal the host
    pipeline's (the same float64 torch code on the same samples), and so do the
    normalised observations in storage, the discounted returns and the scaled
    rewards up to the bootstrap's rounding (see the test above)."""
    extra = [("vec.num_envs", 4), *NORMALISED]
    host = Trainer(config(env, *extra))
    device = Trainer(config(env, *extra, ("vec.backend", "device")))
    run_updates(host, 3)
    run_updates(device, 3)
    torch.testing.assert_close(host.storage.actions, device.storage.actions, rtol=0, atol=0)
    assert_same_normalisers(host, device)
    # One checkpoint format: the host path's state loads on the device path as it is.
    saved = host.pipeline.state_dict()
    fresh = Trainer(config(env, *extra, ("vec.backend", "device")))
    fresh.pipeline.load_state_dict(saved)
    for name, state in fresh.pipeline.state_dict().items():
        for key, value in state.items():
            assert np.array_equal(value, saved[name][key]), (name, key)
    assert fresh.pipeline.obs_norm.stats.mean.device == fresh.device
    for trainer in (host, device, fresh):
        trainer.close()


def assert_same_normalisers(host, device):
    mine, theirs = host.pipeline.state_dict(), device.pipeline.state_dict()
    for name in ("obs_normalizer", "reward_scaler"):
        assert mine[name].keys() == theirs[name].keys()
        assert mine[name]["count"] == theirs[name]["count"] > 0
        assert type(theirs[name]["count"]) is int
        for key, value in theirs[name].items():
            if isinstance(value, torch.Tensor):   # the checkpoint holds float64 CPU tensors
                assert value.dtype == torch.float64 and value.device.type == "cpu"
                torch.testing.assert_close(mine[name][key], value, rtol=1e-12, atol=0)
    torch.testing.assert_close(host.storage.obs, device.storage.obs, rtol=0, atol=0)
    torch.testing.assert_close(host.storage.rewards, device.storage.rewards,
                               rtol=1e-5, atol=1e-6)


class FlickerEnv(ToyBatch):
    """Agent rows that die and revive at random (about 40% dead, and every fourth step
    all dead), with observations of three scales on live rows and a garbage value
    of 1e4 on dead ones, which would dominate the statistics if they were counted.
    Episodes end every `limit` steps (rows staggered) and at random terminals; it
    records every live observation it hands out, for a NumPy reference."""

    def __init__(self, num_envs=6, limit=5, seed=0):
        super().__init__(num_envs, 3, spaces.Discrete(2, dtype=np.int32))
        self.limit, self.rng = limit, np.random.default_rng(seed)
        self.masks = np.ones(num_envs, bool)
        self.counts = np.arange(num_envs) % limit
        self.steps, self.live_seen = 0, []

    def _observe(self):
        self.masks[:] = (self.rng.random(self.num_envs) < 0.6) & (self.steps % 4 != 3)
        self.observations[:] = self.rng.normal([5.0, -2.0, 100.0], [1.0, 3.0, 20.0],
                                               size=self.observations.shape)
        self.observations[~self.masks] = 1e4
        self.live_seen.append(self.observations[self.masks].copy())

    def reset(self, seed=None):
        self._observe()
        return self.observations, {}

    def step(self, actions):
        self.steps += 1
        self.counts += 1
        self.rewards[:] = np.where(self.masks, self.rng.normal(1.0, 2.0, self.num_envs), 0.0)
        self.terminals[:] = self.rng.random(self.num_envs) < 0.05
        self.truncations[:] = (self.counts >= self.limit) & ~self.terminals
        ended = self.terminals | self.truncations
        self.counts[ended] = 0
        self.final_observations[:] = self.observations
        self.record_episodes(np.ones(ended.sum()), np.ones(ended.sum()))
        self._observe()
        return self.observations, self.rewards, self.terminals, self.truncations, {}


class TensorBatch:
    """A host batch presented as a device batch is (its buffers as tensors, here CPU
    ones, and an `actions` tensor it steps on), so the device pipeline can be run on
    an env with dead rows; the native envs have none."""

    BUFFERS = ("observations", "final_observations", "rewards", "terminals", "truncations",
               "masks")

    def __init__(self, env):
        self.env = env
        for name in self.BUFFERS:
            setattr(self, name, torch.from_numpy(getattr(env, name)))
        self.num_envs, self.num_agents = env.num_envs, env.num_agents
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.actions = torch.zeros(env.num_agents, dtype=torch.int32)

    def reset(self, seed=None):
        self.env.reset(seed)
        return self.observations, {}

    def step(self, actions):
        self.env.step(actions.numpy())
        return self.observations, self.rewards, self.terminals, self.truncations, {}

    def episode_stats(self, clear=True):
        return self.env.episode_stats(clear)

    def close(self):
        self.env.close()


def test_device_normalisers_with_agent_masks_equal_the_host_ones_and_numpy():
    """Dead rows: the device pipeline (masked sums over the env's mask tensor) keeps
    the statistics of the live rows only, equal to NumPy's over exactly those rows and
    to the host pipeline's (boolean selection) on the same episodes, including steps
    with no live row."""
    overrides = [("vec.num_envs", 6), ("train.horizon", 12), ("train.minibatch_size", 24),
                 ("train.update_epochs", 1), *NORMALISED]
    host_env, device_env = FlickerEnv(), TensorBatch(FlickerEnv())
    host = Trainer(load_config("cartpole", overrides=overrides), env=host_env)
    device = Trainer(load_config("cartpole", overrides=overrides), env=device_env)
    assert type(device.pipeline).__name__ == "DeviceObservationPipeline"
    run_updates(host, 2)
    run_updates(device, 2)
    assert_same_normalisers(host, device)
    live = np.concatenate(device_env.env.live_seen).astype(np.float64)
    stats = device.pipeline.obs_norm.stats
    assert stats.count == len(live) < 6 * (2 * 12 + 1)        # dead rows left out
    np.testing.assert_allclose(stats.mean, live.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.var, live.var(0), rtol=1e-10)
    host.close()
    device.close()


def test_device_path_with_normalisers_trains_cartpole_to_the_solve_threshold():
    """The shipped CartPole config on the device path with train.normalize_obs and
    normalize_reward on solves (mean return >= 475) within its step budget, and the
    statistics counted every step."""
    from peregrine.train.run import train
    import tempfile
    cfg = load_config("cartpole", overrides=[("vec.backend", "device"), *NORMALISED,
                                             ("train.tensorboard", False)])
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(cfg, run_dir + "/run")
        payload = checkpoint.load(summary["checkpoint"])
    assert summary["stopped_at_return"], summary
    assert summary["recent_return"] >= 475
    assert payload["reward_scaler"]["count"] == summary["global_step"]


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


def test_cuda_is_resolved_to_its_index(monkeypatch):
    """torch.device("cuda") != torch.device("cuda:0"), while every tensor made on it
    says "cuda:0": the trainer names CUDA with the current device's index, so its
    device equals the env buffers' (the H200's first run failed on exactly this)."""
    from peregrine.train import ppo
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert ppo.resolve_device("cuda") == torch.device("cuda", 3)
    assert ppo.resolve_device("auto") == torch.device("cuda", 3)
    assert ppo.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert ppo.resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ppo.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="no CUDA device is available"):
        ppo.resolve_device("cuda:0")
