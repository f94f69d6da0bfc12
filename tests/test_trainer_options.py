"""Trainer options users switch: target_kl's early stop, max_grad_norm = 0, a CUDA
device that is not there, a checkpoint without env state, torch.compile's fallbacks,
and the overlap trainer's refusals."""
from __future__ import annotations

import copy
import sys
import warnings

import pytest
import torch

from peregrine.train import compiling
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer, resolve_device

# 4 envs x 16 steps = 64 samples: 4 minibatches of 16 per epoch.
SMALL = [("vec.num_envs", 4), ("train.horizon", 16), ("train.minibatch_size", 16),
         ("train.update_epochs", 3), ("train.total_steps", 10**6), ("policy.hidden_size", 16)]


def small_trainer(*extra, **kwargs):
    return Trainer(load_config("cartpole", overrides=SMALL + list(extra)), **kwargs)


def count_gradient_steps(trainer):
    calls = []
    step = trainer._gradient_step

    def counted(*args, **kwargs):
        calls.append(1)
        return step(*args, **kwargs)
    trainer._gradient_step = counted
    return calls


@pytest.mark.parametrize("target_kl, epochs", [(0.0, 3), (1e-12, 1)])
def test_target_kl_stops_the_epochs_once_exceeded(target_kl, epochs):
    trainer = small_trainer(("train.target_kl", target_kl))
    try:
        trainer.update()       # the first update's ratio is 1 until the first step: learn once
        calls = count_gradient_steps(trainer)
        record = trainer.update()
        assert len(calls) == 4 * epochs
        if target_kl:
            assert record["losses"]["approx_kl"] > target_kl
    finally:
        trainer.close()


@pytest.mark.parametrize("max_grad_norm, clipped", [(0.5, True), (0.0, False)])
def test_max_grad_norm_zero_turns_clipping_off(monkeypatch, max_grad_norm, clipped):
    norms = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda parameters, norm, *a, **k: norms.append(norm) or clip(
                            parameters, norm, *a, **k))
    trainer = small_trainer(("train.max_grad_norm", max_grad_norm))
    try:
        trainer.update()
    finally:
        trainer.close()
    assert norms == ([max_grad_norm] * 12 if clipped else [])


@pytest.mark.parametrize("deterministic", [True, False])
def test_deterministic_false_leaves_torchs_setting_alone(monkeypatch, deterministic):
    from peregrine.train import torch_startup
    calls = []
    monkeypatch.setattr(torch_startup, "use_deterministic_algorithms", lambda: calls.append(1))
    small_trainer(("train.deterministic", deterministic)).close()
    assert calls == ([1] if deterministic else [])


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_refused_and_auto_means_cpu():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="train.device = 'cuda' but no CUDA device is available"):
        small_trainer(("train.device", "cuda"))


@pytest.mark.parametrize("lstm", [False, True])
def test_a_checkpoint_without_env_state_resumes_with_fresh_episodes(lstm):
    """An env that cannot snapshot its instances (or a checkpoint without their states)
    resumes from episodes started with a seed derived from the update count, the
    recurrent state zeroed: the same fresh start every time."""
    extra = [("policy.lstm", lstm), ("policy.bptt_horizon", 8)]
    trainer = small_trainer(*extra)
    try:
        trainer.update()
        state = trainer.state_dict()
    finally:
        trainer.close()
    assert state["env_state"] is not None
    state["env_state"] = None
    results = []
    for _ in range(2):
        resumed = small_trainer(*extra)
        try:
            # a copy each time: torch's Optimizer.load_state_dict keeps the dict's tensors
            resumed.load_state_dict(copy.deepcopy(state))
            assert resumed.updates == 1 and bool(resumed.rollout_state.starts.all())
            assert not lstm or all(not s.any() for s in resumed.rollout_state.lstm)
            results.append((resumed.env.observations.copy(), resumed.update()["losses"]))
        finally:
            resumed.close()
    assert (results[0][0] == results[1][0]).all() and results[0][1] == results[1][1]


# ---- torch.compile's fallbacks ------------------------------------------------------------

def eager_with_warning(trainer_factory, match):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = trainer_factory()
    try:
        ours = [w for w in caught if "train.compile = true but torch.compile is unavailable"
                in str(w.message)]
        assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning)
        assert match in str(ours[0].message), str(ours[0].message)
        assert not trainer.compiled and trainer.compile_seconds == 0.0
        assert trainer.update()["global_step"] == 64
    finally:
        trainer.close()


def test_without_dynamo_support_it_warns_and_trains_eagerly(monkeypatch):
    import torch._dynamo
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    assert f"torch {torch.__version__} does not support torch.compile on Python " \
           f"{sys.version_info.major}.{sys.version_info.minor}" in \
           compiling.unavailable_reason(torch.device("cpu"))
    eager_with_warning(lambda: small_trainer(("train.compile", True)),
                       "does not support torch.compile")


def test_without_dynamo_at_all_it_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch._dynamo", None)
    assert compiling.unavailable_reason(torch.device("cpu")).startswith(
        "torch._dynamo cannot be imported")


def test_a_compile_error_warns_names_it_and_trains_eagerly(monkeypatch):
    def failing(function, device):
        def call(*args):
            raise RuntimeError("inductor exploded")
        return call
    monkeypatch.setattr(compiling, "compile_function", failing)
    monkeypatch.setattr(compiling, "unavailable_reason", lambda device: None)
    eager_with_warning(lambda: small_trainer(("train.compile", True)),
                       "compiling failed with RuntimeError: inductor exploded")


def test_a_teacher_object_is_refused_with_compile():
    with pytest.raises(ValueError, match="train.compile = true does not support train.teacher"):
        small_trainer(("train.compile", True), teacher=lambda observations: observations[:, 0] > 0)


# ---- the overlap trainer's refusals -------------------------------------------------------

def test_overlap_trainer_refuses_what_it_cannot_do():
    from peregrine.train.overlap import OverlapTrainer
    with pytest.raises(ValueError, match="OverlapTrainer needs train.overlap = true"):
        OverlapTrainer(load_config("cartpole", overrides=SMALL))
    config = load_config("cartpole", overrides=SMALL + [("train.overlap", True)])
    import peregrine
    env = peregrine.make("cartpole", num_envs=4)
    try:
        with pytest.raises(ValueError, match="train.overlap = true does not support an env "
                                             "object"):
            OverlapTrainer(config, env=env)
    finally:
        env.close()
    with pytest.raises(ValueError, match="train.overlap = true does not support train.teacher"):
        OverlapTrainer(config, teacher=lambda observations: observations)
    with pytest.raises(ValueError, match="train.overlap = true does not support several ranks"):
        OverlapTrainer(config, dist=object())


def test_overlap_from_an_unguarded_script_names_the_line_to_guard(monkeypatch):
    from peregrine.train.overlap import OverlapTrainer
    from peregrine.vector import processes
    closed = []
    monkeypatch.setattr(processes, "unguarded_main_call", lambda: ("train_me.py", 12))
    original_close = OverlapTrainer.close
    monkeypatch.setattr(OverlapTrainer, "close",
                        lambda self: closed.append(self.env is not None) or original_close(self))
    with pytest.raises(RuntimeError, match=r"re-imports the main script train_me.py; put the "
                                           r"code that trains \(line 12\) under `if __name__"):
        OverlapTrainer(load_config("cartpole", overrides=SMALL + [("train.overlap", True)]))
    assert closed == [True]        # the env it had made was closed, not leaked


# ---- resume and env buffers ---------------------------------------------------------------

def test_resuming_without_the_normaliser_statistics_the_run_needs_is_refused():
    plain = small_trainer()
    try:
        plain.update()
        state = plain.state_dict()
    finally:
        plain.close()
    for key, name in (("train.normalize_obs", "obs_normalizer"),
                      ("train.normalize_reward", "reward_scaler")):
        resumed = small_trainer((key, True))
        try:
            with pytest.raises(ValueError, match=f"checkpoint has no {name} statistics but this "
                                                 f"run has {key} on"):
                resumed.load_state_dict(copy.deepcopy(state))
        finally:
            resumed.close()


class FreshArrays:
    """A batch whose step returns new arrays each time (not its buffers, updated in place)."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def reset(self, seed=None):
        observations, infos = self._env.reset(seed=seed)
        return observations.copy(), infos

    def step(self, actions):
        observations, rewards, terminals, truncations, infos = self._env.step(actions)
        return observations.copy(), rewards.copy(), terminals.copy(), truncations.copy(), infos


@pytest.mark.parametrize("normalize", [False, True])
def test_a_batch_returning_fresh_arrays_trains_as_one_updating_in_place(normalize):
    import peregrine
    extra = [("train.normalize_obs", normalize), ("train.normalize_reward", normalize)]
    losses = []
    for wrap in (False, True):
        env = peregrine.make("cartpole", num_envs=4, seed=11)
        trainer = small_trainer(*extra, env=FreshArrays(env) if wrap else env)
        try:
            losses.append([trainer.update()["losses"] for _ in range(2)])
        finally:
            trainer.close()
            env.close()
    assert losses[0] == losses[1]


def test_overlap_recomputes_log_probs_under_the_action_mask():
    """Prospector masks invalid actions: the learner's recomputation of the actor's
    log-probs must apply the same mask, or rollout 0 (collected with the very weights
    update 0 starts from) would not have importance weights of 1."""
    from peregrine.train.overlap import OverlapTrainer
    trainer = OverlapTrainer(load_config("prospector", overrides=[
        ("vec.num_envs", 4), ("train.horizon", 16), ("train.minibatch_size", 32),
        ("train.update_epochs", 1), ("train.total_steps", 10**6), ("policy.hidden_size", 16),
        ("train.overlap", True)]))
    try:
        assert trainer.storage.action_mask is not None
        first, second = trainer.update(), trainer.update()
        assert first["losses"]["importance_weight"] == pytest.approx(1.0, abs=1e-5)
        assert second["losses"]["importance_weight"] < 1.0
    finally:
        trainer.close()
