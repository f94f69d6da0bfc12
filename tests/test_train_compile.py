"""train.compile: the compiled rollout step and minibatch loss (train/compiling.py).

Tiny models and batches: the compile itself (a few seconds per graph on the
CPU, inductor) is most of this file's time; trainers with the same shapes reuse
the graphs compiled for the first one.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from gymnasium import spaces

from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer

pytestmark = pytest.mark.slow

# 4 envs x 8 steps = 32 samples: minibatches of 12, 12 and a remainder of 8.
TINY = [("vec.num_envs", 4), ("train.horizon", 8), ("train.minibatch_size", 12),
        ("train.update_epochs", 2), ("train.total_steps", 10**6), ("policy.hidden_size", 8)]


def make_trainer(env="cartpole", compile=True, **overrides):
    pairs = TINY + [("train.compile", compile)] + [
        (key.replace("__", "."), value) for key, value in overrides.items()]
    return Trainer(load_config(env, overrides=pairs))


def graphs() -> int:
    """Graphs Dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def parameters(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.policy.parameters()]


@pytest.mark.parametrize("key, value, named", [
    ("policy.lstm", True, "policy.lstm"),
    ("train.overlap", True, "train.overlap"),
    ("train.teacher", "random", "train.teacher"),
])
def test_unsupported_combinations_are_refused_by_name(key, value, named):
    with pytest.raises(ValueError, match=f"train.compile = true does not support {named}"):
        load_config("cartpole", overrides=[("train.compile", True), (key, value)])
    with pytest.raises(ValueError, match="vec.split = 2"):
        load_config("cartpole", overrides=[("train.compile", True), ("vec.split", 2)])
    with pytest.raises(ValueError, match="train.compile"):
        load_config("cartpole", overrides=[("train.compile", "sometimes")])


@pytest.mark.parametrize("action_space", [
    spaces.Discrete(5), spaces.MultiDiscrete([3, 4, 2]), spaces.Box(-1, 1, (3,), np.float32)])
def test_drawn_numbers_give_the_samples_of_the_generator(action_space):
    """The compiled step samples from `Policy.draw`'s numbers (`sample_from`): the same
    actions and log-probs as `sample` drawing from a generator with the same state."""
    from peregrine.train.policy import Policy
    policy = Policy(spaces.Box(-1, 1, (4,), np.float32), action_space,
                    load_config("cartpole").policy)
    params = torch.randn(64, policy.action_dim) * 3
    mask = torch.rand(64, 5) < 0.5 if isinstance(action_space, spaces.Discrete) else None
    if mask is not None:
        mask[:, 0] = True
    drawn = policy.draw(64, torch.Generator().manual_seed(3), params.device)
    want = policy.sample(params, torch.Generator().manual_seed(3), mask)
    got = policy.sample_from(params, drawn, mask)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("env, overrides, tolerance", [
    ("cartpole", {}, 1e-5),                                 # Discrete, fp32
    ("prospector", {}, 1e-5),                               # Discrete with action masks
    ("pendulum", {"train__precision": "bf16"}, 2e-2),       # Box, bf16 autocast
])
def test_one_compiled_update_matches_the_eager_update(env, overrides, tolerance):
    eager = make_trainer(env, compile=False, **overrides)
    compiled = make_trainer(env, **overrides)
    try:
        assert compiled.compiled and compiled.compile_seconds >= 0.0
        if env == "prospector":
            assert compiled.storage.action_mask is not None
        before = graphs()
        records = [trainer.update() for trainer in (eager, compiled)]
        assert graphs() == before                       # no compile inside an update
        # Same draws from the same generator: the same actions (Discrete exactly).
        torch.testing.assert_close(compiled.storage.actions, eager.storage.actions,
                                   rtol=0, atol=tolerance)
        torch.testing.assert_close(compiled.storage.logprobs, eager.storage.logprobs,
                                   rtol=tolerance, atol=tolerance)
        for got, want in zip(parameters(compiled), parameters(eager)):
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
        for name, value in records[0]["losses"].items():
            assert records[1]["losses"][name] == pytest.approx(value, rel=tolerance,
                                                               abs=tolerance)
        assert records[1]["compile_seconds"] == compiled.compile_seconds
        assert set(records[1]["time_split"]) == set(records[0]["time_split"])
    finally:
        eager.close()
        compiled.close()


def test_compiled_runs_are_deterministic_compile_once_and_route_the_remainder_eagerly():
    before = graphs()
    first = make_trainer()
    assert graphs() - before <= 2          # the rollout step and the loss (0 if cached)
    # Count which minibatches took which path: 12, 12 compiled, the remainder of 8 eager.
    routed = first._minibatch_loss
    calls = {"compiled": 0, "eager": 0}

    def counting(kind, function):
        def call(*args, **kwargs):
            calls[kind] += 1
            return function(*args, **kwargs)
        return call
    routed.compiled = counting("compiled", routed.compiled)
    routed.eager = counting("eager", routed.eager)
    second = make_trainer()
    try:
        compiled_so_far = graphs()
        for _ in range(3):
            first.update()
            second.update()
        assert graphs() == compiled_so_far     # no recompilation across updates
        assert calls == {"compiled": 3 * 2 * 2, "eager": 3 * 2}
        for got, want in zip(parameters(second), parameters(first)):
            assert torch.equal(got, want)
    finally:
        first.close()
        second.close()


def test_compiled_resume_is_exact():
    reference, stopped = make_trainer(), make_trainer()
    try:
        for _ in range(3):
            reference.update()
        for _ in range(2):
            stopped.update()
        state = stopped.state_dict()
    finally:
        stopped.close()
    resumed = make_trainer()
    try:
        resumed.load_state_dict(state)
        resumed.update()
        assert resumed.updates == reference.updates
        for got, want in zip(parameters(resumed), parameters(reference)):
            assert torch.equal(got, want)
    finally:
        reference.close()
        resumed.close()


def test_without_a_cpp_compiler_it_warns_once_and_trains_eagerly():
    import torch._inductor.config as inductor_config
    # torch's own config patching (pytest's monkeypatch would delete the key on undo
    # and break every later compile in the process)
    with inductor_config.patch({"cpp.cxx": (None, "peregrine-no-such-c++")}), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer()
    try:
        ours = [w for w in caught if "train.compile" in str(w.message)]
        assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning)
        assert "no C++ compiler" in str(ours[0].message)
        assert not trainer.compiled and trainer.compile_seconds == 0.0
        assert trainer.update()["global_step"] == 32
    finally:
        trainer.close()


def test_compiled_gae_is_a_fixed_number_of_kernels_whatever_the_horizon():
    """The scan train.compile runs on CUDA (compiling.compiled_gae), built here for the
    CPU from the same graph: equal to the NumPy GAE (with V-trace weights too), and
    the number of generated kernels does not grow with the horizon (the eager torch
    path launches one or more per time step)."""
    import torch._inductor.metrics as metrics
    from peregrine.train.advantages import compute_gae, gae_scan
    from peregrine.train.compiling import compile_function
    kernels = {}
    for horizon in (8, 32):
        g = torch.Generator().manual_seed(horizon)
        rewards, values = torch.randn(horizon, 64, generator=g), torch.randn(horizon, 64, generator=g)
        dones = torch.rand(horizon, 64, generator=g) < 0.1
        last, weights = torch.randn(64, generator=g), torch.rand(horizon, 64, generator=g)
        metrics.reset()
        scan = compile_function(gae_scan, torch.device("cpu"))
        got = scan(rewards, values, dones, last, 0.97, 0.9)
        kernels[horizon] = metrics.generated_kernel_count
        torch.testing.assert_close(got, compute_gae(rewards, values, dones, last, 0.97, 0.9),
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            scan(rewards, values, dones, last, 0.97, 0.9, weights),
            compute_gae(rewards, values, dones, last, 0.97, 0.9, importance=weights),
            rtol=1e-5, atol=1e-5)
    assert 1 <= kernels[8] == kernels[32] <= 4, kernels
