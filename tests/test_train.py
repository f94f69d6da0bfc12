"""PPO learns CartPole; configs and the `peregrine train` command behave."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces

from peregrine.cli import main as cli_main
from peregrine.train.config import load_config, parse_override_tokens, read_toml
from peregrine.train.ppo import Trainer
from polling import poll_until


def test_ppo_learns_cartpole():
    """A random policy averages ~22; the shipped config reaches far above that in 40k steps."""
    config = load_config("cartpole", overrides=[("train.total_steps", 40_000), ("train.seed", 3)])
    trainer = Trainer(config)
    first = None
    while not trainer.done:
        record = trainer.update()
        if first is None and record["episode_return"] is not None:
            first = record["episode_return"]
    recent = trainer.recent_return()
    trainer.close()
    assert first < 60, first
    assert recent > 150, f"mean return {recent:.1f} after 40k steps"


def test_evaluation_policy_plays_better_than_chance(tmp_path):
    from peregrine.train import checkpoint
    from peregrine.train.run import train
    import peregrine
    config = load_config("cartpole", overrides=[("train.total_steps", 20_000)])
    summary = train(config, tmp_path / "run")
    env = peregrine.make("cartpole", num_envs=16, seed=123)
    actor = checkpoint.load_actor(summary["checkpoint"], env)
    observations, _ = env.reset(seed=123)
    for _ in range(300):
        observations, *_ = env.step(actor(observations))
    stats = env.episode_stats()
    env.close()
    # Deterministic actions from a briefly trained policy: far better than random (~22).
    assert stats.count == 0 or stats.mean["episode_return"] > 60


# ---- config -----------------------------------------------------------------------

def test_shipped_config_and_overrides():
    config = load_config("cartpole", overrides=parse_override_tokens(
        ["--train.learning-rate", "1e-3", "--vec.num-envs=64", "--train.total-steps", "2e5",
         "--env.max-steps", "200", "--policy.lstm", "true", "--train.norm_adv", "false"]))
    assert config.train.learning_rate == 1e-3 and config.vec.num_envs == 64
    assert config.train.total_steps == 200_000 and config.env["max_steps"] == 200
    assert config.policy.lstm is True and config.train.norm_adv is False
    shipped = read_toml(__import__("peregrine.train.config", fromlist=["x"]).shipped_config_path(
        "cartpole"))
    assert config.train.horizon == shipped["train"]["horizon"]


@pytest.mark.parametrize("tokens, message", [
    (["--train.learning-rat", "1"], r"unknown config key train.learning_rat; valid keys .*learning_rate"),
    (["--vec.num-envs", "many"], "vec.num_envs must be an integer"),
    (["--vec.num-envs", "0"], "vec.num_envs must be >= 1"),
    (["--train.gamma", "1.5"], r"train.gamma must be in \[0, 1\]"),
    (["--train.device", "tpu"], "is not one of"),
    (["--env.gravityy", "3"], r"unknown config key env.gravityy for cartpole; valid keys.*gravity"),
    (["--bogus.key", "1"], "SECTION one of"),
    (["--train.seed"], "needs a value"),
    (["positional"], "unexpected argument"),
    (["--train.anneal-lr", "maybe"], "must be true or false"),
])
def test_bad_overrides_are_refused_with_the_valid_keys(tokens, message):
    with pytest.raises(ValueError, match=message):
        load_config("cartpole", overrides=parse_override_tokens(tokens))


def test_config_file_layers_and_errors(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[train]\nlearning_rate = 0.01\n[vec]\nnum_envs = 4\n")
    config = load_config("cartpole", good, [("vec.num_envs", "8")])
    assert config.train.learning_rate == 0.01 and config.vec.num_envs == 8
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config("cartpole", bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[training]\nx = 1\n")
    with pytest.raises(ValueError, match="unknown config section"):
        load_config("cartpole", unknown)
    with pytest.raises(ValueError, match="does not exist"):
        load_config("cartpole", tmp_path / "missing.toml")


def test_resolved_config_round_trips_through_toml(tmp_path):
    config = load_config("cartpole", overrides=[("train.learning_rate", "0.0123"),
                                                ("env.gravity", "9.0")])
    path = tmp_path / "config.toml"
    path.write_text(config.to_toml())
    again = load_config("cartpole", base=read_toml(path))
    assert again.to_dict() == config.to_dict()


# ---- command line -------------------------------------------------------------------

def test_cli_train_writes_run_dir_and_resumes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli_main(["train", "cartpole", "--detach", "--run-dir", str(run_dir),
                     "--train.total-steps", "2048", "--vec.num-envs", "8", "--seed", "5"])
    assert code == 0
    out = capsys.readouterr().out
    assert "finished" in out and "checkpoint" in out
    config = read_toml(run_dir / "config.toml")
    assert config["train"]["seed"] == 5 and config["vec"]["num_envs"] == 8
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert records[-1] == {"status": "finished"}
    assert records[-2]["global_step"] == 2048
    assert set(records[-2]["losses"]) >= {"policy_loss", "value_loss", "entropy", "approx_kl",
                                          "clip_fraction", "learning_rate"}
    assert set(records[-2]["time_split"]) == {"env", "forward", "learn"}
    assert (run_dir / "checkpoints" / "latest.pt").is_file()

    code = cli_main(["train", "--resume", str(run_dir), "--train.total-steps", "4096"])
    assert code == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert records[-2]["global_step"] == 4096
    assert read_toml(run_dir / "config.toml")["train"]["total_steps"] == 4096


def test_cli_plain_progress_lines(tmp_path, capsys):
    code = cli_main(["train", "cartpole", "--run-dir", str(tmp_path / "r"),
                     "--train.total-steps", "4096", "--vec.num-envs", "8",
                     "--train.progress-interval", "4"])
    assert code == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("update")]
    assert len(lines) == 4 and "SPS" in lines[0]


def test_python_train_prints_progress_lines_only_when_asked(tmp_path, capsys):
    from peregrine.train import train
    config = load_config("cartpole", overrides=[("train.total_steps", 2048),
                                                ("vec.num_envs", 8),
                                                ("train.progress_interval", 2),
                                                ("train.tensorboard", False)])
    train(config, tmp_path / "quiet")
    assert capsys.readouterr().out == ""
    train(config, tmp_path / "told", progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(line.startswith("update") and "SPS" in line
                                   for line in lines)


@pytest.mark.parametrize("argv, message", [
    (["train", "cartpole", "--train.nope", "1"], "unknown config key train.nope"),
    (["train", "nosuchenv"], "unknown env 'nosuchenv'"),
    (["train"], "give an env"),
    (["train", "--resume", "/nonexistent/run"], "no config.toml"),
])
def test_cli_errors_are_one_clear_line(argv, message, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_resume_with_corrupt_checkpoint_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli_main(["train", "cartpole", "--detach", "--run-dir", str(run_dir),
                     "--train.total-steps", "512", "--vec.num-envs", "8"]) == 0
    path = run_dir / "checkpoints" / "latest.pt"
    path.write_bytes(path.read_bytes()[:-10])
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run_dir)]) == 2
    assert "truncated" in capsys.readouterr().err


def test_ctrl_c_checkpoints_and_resume_continues(tmp_path):
    """A real SIGINT: the run finishes its update, saves, exits 130; --resume goes on."""
    import signal
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "peregrine.cli", "train", "cartpole", "--detach", "--run-dir",
         str(run_dir), "--train.total-steps", "1e9", "--vec.num-envs", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    poll_until(lambda: metrics.exists() and metrics.stat().st_size > 0, 60, 0.1)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "interrupted" in out
    # said at the signal, before the update ends
    assert "SIGINT: stopping after this update, then saving; Ctrl-C again stops at once" in err
    assert f"resume:     peregrine train --resume {run_dir}\n" in out     # what to do next
    records = [json.loads(line) for line in metrics.open()]
    assert records[-1] == {"status": "interrupted"}
    from peregrine.train import checkpoint
    state = checkpoint.load(run_dir / "checkpoints" / "latest.pt")
    assert state["updates"] == records[-2]["updates"]


def _logged_updates(path):
    """The "updates" of every complete record line of a metrics.jsonl."""
    updates = []
    for line in path.read_text().splitlines(keepends=True):
        if line.endswith("\n") and '"updates"' in line:
            updates.append(json.loads(line)["updates"])
    return updates


@pytest.mark.slow
def test_kill_9_and_resume_logs_every_update_once(tmp_path):
    """kill -9 at a random point, then --resume: metrics.jsonl holds updates 1, 2, ... N
    once each, although the updates after the last checkpoint were redone."""
    import random
    import time
    from peregrine.train import checkpoint
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    run_dir = tmp_path / "run"
    metrics = run_dir / "metrics.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "peregrine.cli", "train", "cartpole", "--detach", "--run-dir",
         str(run_dir), "--train.total-steps", "1e9", "--vec.num-envs", "8", "--train.horizon",
         "16", "--train.checkpoint-interval", "5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    target = rng.randint(6, 14)     # past the first checkpoint, anywhere in the interval
    poll_until(lambda: process.poll() is not None or (
        metrics.exists() and len(_logged_updates(metrics)) >= target), 90, 0.01)
    time.sleep(rng.uniform(0.0, 0.05))
    process.kill()
    _, err = process.communicate(timeout=30)
    assert process.returncode == -9, err.decode()
    saved = checkpoint.load(run_dir / "checkpoints" / "latest.pt")["updates"]
    logged = max(_logged_updates(metrics))
    assert logged >= saved >= 5
    final = (logged + 2) * 8 * 16
    done = subprocess.run([sys.executable, "-m", "peregrine.cli", "train", "--resume",
                           str(run_dir), "--detach", "--train.total-steps", str(final)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    updates = _logged_updates(metrics)
    assert updates == list(range(1, logged + 3)), \
        f"random seed {seed}, checkpoint at update {saved}: {updates}"


# ---- other action spaces and the LSTM ------------------------------------------------

@pytest.mark.parametrize("space", [
    spaces.MultiDiscrete(np.array([3, 2, 4]), dtype=np.int32),
    spaces.Box(-1.0, 1.0, (2,), np.float32),
])
def test_other_action_spaces_train_and_act(space):
    from peregrine.train.checkpoint import Actor
    from test_train_bootstrap import CounterEnv
    env = CounterEnv(num_envs=8, limit=6, action_space=space)
    config = load_config("cartpole", overrides=[("vec.num_envs", 8), ("train.horizon", 8),
                                                ("train.minibatch_size", 32)])
    trainer = Trainer(config, env=env)
    trainer.update()
    assert env.last_actions.dtype == space.dtype and env.last_actions.shape == (8, *space.shape)
    assert all(space.contains(a) for a in env.last_actions)
    actions = Actor(trainer.policy, space)(env.observations)
    assert actions.shape == (8, *space.shape) and actions.dtype == space.dtype
    trainer.close()


@pytest.mark.parametrize("space", [
    spaces.Discrete(3), spaces.MultiDiscrete(np.array([3, 2])), spaces.Box(-1, 1, (3,), np.float32)])
def test_log_probs_and_entropy_match_torch_distributions(space):
    from peregrine.train.config import PolicyConfig
    from peregrine.train.policy import Policy
    torch.manual_seed(0)
    policy = Policy(spaces.Box(-1, 1, (4,), np.float32), space, PolicyConfig())
    params, _values, _ = policy.heads(torch.randn(64, 4))
    params = params + torch.randn_like(params)  # away from the near-uniform init
    actions, logprobs = policy.sample(params, torch.Generator().manual_seed(0))
    got_lp, got_ent = policy.log_prob_entropy(params, actions)
    if isinstance(space, spaces.Box):
        dist = torch.distributions.Normal(params, policy.log_std.exp())
        want_lp, want_ent = dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
    else:
        nvec = [space.n] if isinstance(space, spaces.Discrete) else list(space.nvec)
        columns = actions.unsqueeze(-1) if actions.ndim == 1 else actions
        dists = [torch.distributions.Categorical(logits=x) for x in params.split(nvec, -1)]
        want_lp = sum(d.log_prob(columns[:, i]) for i, d in enumerate(dists))
        want_ent = sum(d.entropy() for d in dists)
    torch.testing.assert_close(logprobs, want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_lp, want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_ent, want_ent, rtol=1e-5, atol=1e-5)


def test_categorical_sampling_follows_the_probabilities():
    from peregrine.train.policy import Policy
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(200_000, 3)
    actions, _ = Policy._sample_categorical(logits, torch.Generator().manual_seed(1))
    frequencies = torch.bincount(actions, minlength=3).float() / actions.numel()
    torch.testing.assert_close(frequencies, torch.tensor([0.2, 0.5, 0.3]), atol=5e-3, rtol=0)


@pytest.mark.parametrize("lstm", [False, True])
def test_replayed_log_probs_equal_rollout_log_probs(lstm):
    """Before any gradient step, re-evaluating the stored rollout (segments + saved LSTM
    state + resets at episode starts) gives back the log-probs and values it was sampled
    with: the state handling in training matches the rollout's."""
    config = load_config("cartpole", overrides=[
        ("vec.num_envs", 8), ("train.horizon", 32), ("policy.lstm", lstm),
        ("policy.bptt_horizon", 8), ("env.max_steps", 10)])
    trainer = Trainer(config)
    trainer.rollout()
    assert trainer.storage.dones.any()
    batches = trainer.minibatches()
    with torch.no_grad():
        for batch, _last in next(iter(batches)):
            logprobs, _entropy, values, _live, _teacher = trainer.evaluate(batch)
            torch.testing.assert_close(logprobs, batch["logprobs"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(values, batch["values"], rtol=1e-4, atol=1e-5)
    trainer.close()


def _shipped():
    from peregrine.train.config import shipped_configs, shipped_variants
    return [(env, None) for env in shipped_configs()] + \
        [(env, variant) for env in shipped_configs() for variant in shipped_variants(env)]


def test_config_variants_are_named_and_unknown_names_are_refused():
    from peregrine.train.config import shipped_configs, shipped_variants
    assert "cartpole" in shipped_configs() and "cartpole-fast" not in shipped_configs()
    assert "fast" in shipped_variants("cartpole")
    fast = load_config("cartpole", "fast")
    assert fast.vec.num_envs == 1024 and fast.policy.activation == "relu"
    assert fast.train.stop_return == load_config("cartpole").train.stop_return  # layered
    with pytest.raises(ValueError, match="neither a file nor a shipped variant.*variants: fast"):
        load_config("cartpole", "fats")


@pytest.mark.parametrize("env_name, variant", _shipped())
def test_every_shipped_config_loads_and_trains_one_small_update(env_name, variant):
    """Each shipped TOML is valid for its env, and its env/policy settings run (sizes shrunk;
    eager: the compiled path has its own tests, tests/test_train_compile.py)."""
    config = load_config(env_name, variant, overrides=[("vec.num_envs", 2), ("train.horizon", 8),
                                              ("policy.bptt_horizon", 8),
                                              ("train.minibatch_size", 16),
                                              ("train.total_steps", 1),
                                              ("train.compile", False)])
    trainer = Trainer(config)
    record = trainer.update()
    assert np.isfinite(record["losses"]["value_loss"])
    trainer.close()


def _tiny_cartpole_trainer():
    config = load_config("cartpole", overrides=[("vec.num_envs", 4), ("train.horizon", 16),
                                                ("train.minibatch_size", 32)])
    return Trainer(config)


def test_a_diverged_policy_stops_training_with_a_clear_error():
    """NaN weights (a diverged run) make every later update NaN: the update raises
    instead of training on, before it is counted (so nothing records or checkpoints it)."""
    trainer = _tiny_cartpole_trainer()
    trainer.update()
    with torch.no_grad():
        next(trainer.policy.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"diverged in update 2 \(after 64 steps\): "
                                                 r"non-finite policy_loss, value_loss"):
        trainer.update()
    assert trainer.updates == 1
    trainer.close()


def test_a_last_gradient_step_that_overflows_the_weights_is_caught_in_its_update():
    """The losses are recorded before the last Adam step; weights it makes infinite are
    caught by the weight check of the same update."""
    trainer = _tiny_cartpole_trainer()
    step = trainer._optimizer_step

    def overflowing_step():
        step()
        with torch.no_grad():
            next(trainer.policy.parameters()).view(-1)[0] = float("inf")
    trainer._optimizer_step = overflowing_step
    with pytest.raises(FloatingPointError, match="update 1 .*non-finite weights"):
        trainer.update()
    trainer.close()


def test_an_env_object_is_the_world_the_run_records(tmp_path):
    """Trainer(config, env=...) trains on the env object: a native env of another name is
    refused, and fields where it differs from config.env are warned about and recorded as
    the env's (the checkpoint said max_steps 20 for a run trained at 500, and eval then
    scored it at 20)."""
    import peregrine
    from peregrine.evaluate import evaluate
    from peregrine.train import checkpoint
    from peregrine.train.ppo import Trainer
    config = load_config("cartpole", overrides=[("train.total_steps", 1024),
                                                ("env.max_steps", 20)])
    with peregrine.make("pendulum", num_envs=8) as other, pytest.raises(
            ValueError, match="the env object is 'pendulum' but config.env.name is 'cartpole'"):
        Trainer(config, env=other)
    with pytest.warns(UserWarning, match="max_steps: config 20, env 500"):
        trainer = Trainer(config, env=peregrine.make("cartpole", num_envs=8))
    try:
        trainer.update()
        checkpoint.save(tmp_path / "latest.pt", trainer.state_dict())
    finally:
        trainer.close()
    assert config.env["max_steps"] == 20        # the caller's config is left as it was
    result = evaluate(None, str(tmp_path / "latest.pt"), episodes=2)
    assert result["env_config"]["max_steps"] == 500


@pytest.mark.parametrize("made", ["a name", "a Gymnasium env"])
def test_an_env_object_without_the_batch_interface_is_named(made):
    import gymnasium
    from peregrine.train.ppo import Trainer
    env = "cartpole" if made == "a name" else gymnasium.make("CartPole-v1")
    with pytest.raises(TypeError, match=r"needs a batch .*has no num_agents.*"
                                        r"peregrine.vector.make\(lambda: YourEnv\(\)"):
        Trainer(load_config("cartpole"), env=env)


def test_python_api_mistakes_are_named(tmp_path):
    """train("cartpole"), progress="yes", a dict for config_file and a closed trainer each
    failed with a generic Python error from deep inside (or, for progress, only after the
    run directory was made)."""
    from peregrine.train import train
    from peregrine.train.ppo import Trainer
    with pytest.raises(TypeError, match=r"train takes a Config.*train\(load_config\('cartpole'\)\)"):
        train("cartpole")
    config = load_config("cartpole", overrides=[("train.total_steps", 512)])
    with pytest.raises(TypeError, match="progress is True"):
        train(config, tmp_path / "run", progress="yes")
    assert not (tmp_path / "run").exists()
    with pytest.raises(TypeError, match=r"values go in overrides=\["):
        load_config("cartpole", {"train": {"learning_rate": 3e-4}})
    trainer = Trainer(config)
    trainer.close()
    with pytest.raises(RuntimeError, match="the trainer is closed"):
        trainer.update()


def test_a_batch_whose_episode_stats_is_not_episode_stats_is_named():
    """A batch of one's own returning a dict from episode_stats() failed deep in the
    trainer ("'dict' object has no attribute 'count'")."""
    from test_train_bootstrap import CounterEnv
    from peregrine.train.ppo import Trainer

    class DictStats(CounterEnv):
        def episode_stats(self, clear=True):
            return {"episode_return": 1.0}
    trainer = Trainer(load_config("cartpole", overrides=[("train.horizon", 8)]),
                      env=DictStats())
    try:
        with pytest.raises(TypeError, match="episode_stats\\(\\) returned dict; it must "
                                            "return an EpisodeStats"):
            trainer.update()
    finally:
        trainer.close()
