"""Training any env: Gymnasium ids, PettingZoo modules, factories and callables, the
spaces they bring, the encoders chosen from them, and eval/render/resume by checkpoint."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import peregrine.vector as pv
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer
from peregrine.train.run import train
from peregrine.vector.sources import (EnvFactory, EnvKeywordError, EnvSourceError,
                                      callable_path, kind_of)
from peregrine.vector.spaces import unflatten

import any_env_toys

TESTS = Path(__file__).resolve().parent
# One learner thread: the suite runs a worker per core, and a learning threshold must not
# depend on the machine's core count (auto gives a CNN every core: test_cores.py).
QUIET = [("train.tensorboard", False), ("train.progress_interval", 1000),
         ("train.torch_threads", 1)]


def _train(name, overrides, run_dir, **kwargs):
    config = load_config(name, overrides=[*QUIET, *overrides], **kwargs)
    return config, train(config, run_dir, overwrite=True)


def _returns(run_dir):
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
               .splitlines()]
    return [r["episode_return"] for r in records if r.get("episode_return") is not None]


# ---- names -------------------------------------------------------------------------

@pytest.mark.parametrize("name, kind", [
    ("cartpole", "native"), ("gym:LunarLander-v3", "gymnasium"), ("gym:ALE/Pong-v5", "gymnasium"),
    ("pettingzoo:butterfly.knights_archers_zombies_v11", "pettingzoo"),
    ("my_package.envs:make_env", "factory")])
def test_every_kind_of_name_is_recognised(name, kind):
    assert kind_of(name) == kind


@pytest.mark.parametrize("name", ["Acrobot-v1", "gym:", "pettingzoo:", "not a name", ""])
def test_an_unknown_name_lists_the_kinds(name):
    with pytest.raises(EnvSourceError, match="gym:ID|needs|non-empty"):
        kind_of(name)
    with pytest.raises(ValueError):
        load_config(name)


def test_a_callable_is_recorded_by_its_import_path_or_kept():
    assert callable_path(any_env_toys.parity_env) == "any_env_toys:parity_env"
    config = load_config(any_env_toys.parity_env)
    assert config.env_name == "any_env_toys:parity_env" and config.env_factory is None
    closure = lambda: any_env_toys.ParityEnv()   # noqa: E731 - no import path on purpose
    config = load_config(closure)
    assert config.env_name.startswith("python:") and config.env_factory is closure
    assert "env_factory" not in config.to_toml()


def test_a_missing_package_is_one_line_naming_what_to_install(monkeypatch):
    with pytest.raises(EnvSourceError) as caught:
        EnvFactory("any_env_toys:needs_a_missing_package")()
    assert "pip install peregrine_missing_simulator" in str(caught.value)
    from gymnasium.error import DependencyNotInstalled

    def missing(*args, **kwargs):
        raise DependencyNotInstalled('Box2D is not installed, you can install it by run '
                                     '`pip install swig` followed by `pip install '
                                     '"gymnasium[box2d]"`\nmore text')
    monkeypatch.setattr(gym, "make", missing)
    with pytest.raises(EnvSourceError) as caught:
        EnvFactory("gym:LunarLander-v3")()
    message = str(caught.value)
    assert "\n" not in message and 'gymnasium[box2d]' in message


def test_the_cli_answers_a_missing_package_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "peregrine.cli", "train", "any_env_toys:needs_a_missing_package",
         "--detach", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=TESTS, timeout=120,
        env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install peregrine_missing_simulator" in lines[0]
    assert not (tmp_path / "run").exists()      # the run directory it made is gone again


def test_a_misspelt_module_names_what_is_there_and_a_missing_one_the_path():
    with pytest.raises(EnvSourceError) as caught:
        EnvFactory("peregrine.no_such_module:make")()
    message = str(caught.value)
    assert "there is no module 'peregrine.no_such_module'" in message
    assert "peregrine has: " in message and " envs," in message and "pip install" not in message
    with pytest.raises(EnvSourceError) as caught:
        EnvFactory("peregrine_no_such_module:make")()
    assert "no module 'peregrine_no_such_module' on the Python path" in str(caught.value)
    assert "PYTHONPATH" in str(caught.value)


def test_keywords_an_env_refuses_are_one_line_naming_them_and_what_it_takes():
    with pytest.raises(EnvKeywordError) as caught:
        EnvFactory("any_env_toys:chain_env", {"lenght": 3})()
    message = str(caught.value)
    assert "\n" not in message and "keywords lenght=3" in message
    assert "unexpected keyword argument 'lenght'" in message and message.endswith("it takes: length")
    assert caught.value.keywords == ["lenght"]
    # a value the env refuses: the env's own reason, and the value shown
    with pytest.raises(EnvKeywordError, match="length='ten'"):
        EnvFactory("any_env_toys:chain_env", {"length": "ten"})()
    # a Gymnasium id: the keywords of the class its spec makes
    with pytest.raises(EnvKeywordError, match="foo=3: .*it takes: .*render_mode"):
        EnvFactory("gym:CartPole-v1", {"foo": 3})()
    # without keywords a TypeError is the env's own bug: raised as it is, traceback and all
    def broken():
        raise TypeError("a bug inside the env")
    with pytest.raises(TypeError, match="a bug inside the env") as caught:
        EnvFactory(broken)()
    assert not isinstance(caught.value, EnvSourceError)


def test_gymnasiums_module_form_names_a_missing_module():
    with pytest.raises(EnvSourceError) as caught:
        EnvFactory("gym:peregrine_no_such_module:Thing-v0")()
    assert "needs the package 'peregrine_no_such_module'" in str(caught.value)
    assert "''" not in str(caught.value)


def test_a_wrapper_that_needs_a_package_or_refuses_its_arguments_is_one_line(monkeypatch):
    from gymnasium.error import DependencyNotInstalled

    class NeedsOpenCV(gym.Wrapper):
        def __init__(self, env):
            raise DependencyNotInstalled("opencv-python package not installed, run `pip "
                                         "install \"gymnasium[other]\"`\nmore text")
    monkeypatch.setattr(gym.wrappers, "NeedsOpenCV", NeedsOpenCV, raising=False)
    with pytest.raises(EnvSourceError) as caught:
        EnvFactory("gym:CartPole-v1", {}, ["NeedsOpenCV"])()
    assert str(caught.value) == ("env.wrappers: NeedsOpenCV needs a package that is not "
                                 "installed: opencv-python package not installed, run `pip "
                                 "install \"gymnasium[other]\"`")
    with pytest.raises(EnvSourceError, match="TimeLimit could not be made with .*it takes: "
                                             "max_episode_steps"):
        EnvFactory("gym:CartPole-v1", {}, [{"name": "TimeLimit", "max_steps": 7}])()


def test_wrappers_are_config_applied_in_order():
    factory = EnvFactory("gym:CartPole-v1", {}, [
        {"name": "TimeLimit", "max_episode_steps": 7}, "NormalizeObservation"])
    env = factory()
    assert isinstance(env, gym.wrappers.NormalizeObservation)
    assert isinstance(env.env, gym.wrappers.TimeLimit)
    with pytest.raises(EnvSourceError, match="not a class of gymnasium.wrappers"):
        EnvFactory("gym:CartPole-v1", {}, ["NoSuchWrapper"])
    with pytest.raises(ValueError, match="env.wrappers"):
        load_config("gym:CartPole-v1", overrides=[("env.wrappers", "[3]")])
    # a TOML array is a tuple to the wrapper (ReshapeObservation refused shape=[2, 2])
    config = load_config("gym:CartPole-v1", overrides=[
        ("env.wrappers", '[{name = "ReshapeObservation", shape = [2, 2]}]')])
    env = config.env_source()()
    assert env.observation_space.shape == (2, 2)
    assert config.env["wrappers"] == [{"name": "ReshapeObservation", "shape": [2, 2]}]  # as written


# ---- training ------------------------------------------------------------------------

def test_training_on_a_gymnasium_id_over_multiprocessing_improves(tmp_path):
    config, summary = _train("gym:CartPole-v1", [
        ("train.total_steps", 40_000), ("vec.num_envs", 8), ("train.horizon", 128),
        ("train.minibatch_size", 256), ("train.learning_rate", 1e-3)], tmp_path / "run")
    assert config.vec.backend == "multiprocessing" and config.vec.num_workers >= 1
    returns = _returns(tmp_path / "run")
    assert summary["status"] == "finished"
    assert np.mean(returns[-5:]) > 2 * np.mean(returns[:3]), returns


def test_training_on_a_factory_with_kwargs_learns(tmp_path):
    _, summary = _train("any_env_toys:chain_env", [
        ("env.length", "4"), ("vec.backend", "serial"), ("train.total_steps", 12_000),
        ("vec.num_envs", 8), ("train.horizon", 64), ("train.minibatch_size", 128),
        ("train.learning_rate", 1e-3)], tmp_path / "run")
    # the corridor of 4 steps ends in 4 steps at best, 16 at worst (the time limit)
    assert summary["recent_return"] > 0.9
    # The run's policy, on the env rebuilt from its checkpoint (keywords included), in
    # Python: make_trained_env knew native envs only ("unknown env 'any_env_toys:...'").
    from peregrine.train.checkpoint import load_actor, make_trained_env
    env = make_trained_env(tmp_path / "run", num_envs=4, seed=3)
    actor = load_actor(tmp_path / "run", env)
    observations, _ = env.reset()
    for _ in range(40):
        observations, *_ = env.step(actor(observations))
    stats = env.episode_stats()
    assert stats.count >= 8 and stats.mean["episode_length"] == 4     # the 4-step corridor
    env.close()
    with pytest.raises(TypeError, match="load_actor needs the env as a batch of flat rows, "
                                        "got .*make_trained_env"):
        load_actor(tmp_path / "run", any_env_toys.chain_env(length=4))


def test_a_python_callable_trains_and_its_checkpoint_asks_for_it_again(tmp_path):
    factory = lambda: any_env_toys.ParityEnv()   # noqa: E731 - not importable on purpose
    config = load_config(factory, overrides=[*QUIET, ("vec.backend", "serial"),
                                             ("train.total_steps", 2048)])
    summary = train(config, tmp_path / "run", overwrite=True)
    assert summary["status"] == "finished"
    from peregrine.evaluate import evaluate
    name = "python:" + factory.__qualname__
    with pytest.raises(ValueError, match="<lambda>', a Python callable without an import "
                                         "path.*pass the callable again"):
        evaluate(None, str(tmp_path / "run"), episodes=2)
    # given the callable again, it evaluates (the checkpoint's name is the callable's)
    result = evaluate(factory, str(tmp_path / "run"), episodes=2)
    assert result["env"] == name and result["episodes"] == 2
    assert result["world"] == "as made, no keywords"
    with pytest.raises(ValueError, match="<lambda>', not 'any_env_toys:parity_env'"):
        evaluate(any_env_toys.parity_env, str(tmp_path / "run"), episodes=2)


def test_a_pettingzoo_env_with_agents_leaving_and_joining_trains(tmp_path):
    """Rows are agents; agent_2 joins after the first step and agents leave when they
    finish, so masks vary within episodes (PettingZooEmulation)."""
    _, summary = _train("any_env_toys:tag_parallel_env", [
        ("vec.backend", "serial"), ("train.total_steps", 6_000), ("vec.num_envs", 4),
        ("train.horizon", 50), ("train.minibatch_size", 200), ("train.learning_rate", 1e-3)],
        tmp_path / "run")
    returns = _returns(tmp_path / "run")
    assert summary["status"] == "finished" and np.mean(returns[-3:]) > np.mean(returns[:2])


def test_a_pettingzoo_module_by_name(tmp_path):
    pytest.importorskip("pymunk")
    pytest.importorskip("pygame")
    config, summary = _train("pettingzoo:butterfly.knights_archers_zombies_v11", [
        ("env.max_cycles", 40), ("vec.backend", "serial"), ("vec.num_envs", 1),
        ("train.total_steps", 2 * 64 * 4), ("train.horizon", 64),
        ("train.minibatch_size", 128)], tmp_path / "run")
    assert summary["global_step"] == 512 and summary["episodes"] >= 1
    # Gymnasium wrappers on a PettingZoo env: the way to wrap one instead
    factory = EnvFactory("pettingzoo:butterfly.knights_archers_zombies_v11", {},
                         ["NormalizeObservation"])
    with pytest.raises(EnvSourceError, match="not a gymnasium.Env: wrap a PettingZoo env in a "
                                             "factory of your own .*SuperSuit"):
        factory()


# ---- encoders ------------------------------------------------------------------------

def _final_reward(name, encoder, tmp_path, steps=8_192):
    _, summary = _train(name, [
        ("vec.backend", "serial"), ("vec.num_envs", 16), ("train.horizon", 32),
        ("train.minibatch_size", 128), ("train.total_steps", steps),
        ("train.learning_rate", 3e-3), ("train.ent_coef", 0.0), ("policy.encoder", encoder)],
        tmp_path / f"{encoder}")
    return summary["recent_return"]


def test_one_hot_encoding_solves_what_the_raw_integer_cannot(tmp_path):
    encoded = _final_reward("any_env_toys:parity_env", "auto", tmp_path)
    raw = _final_reward("any_env_toys:parity_env", "flat", tmp_path)
    assert encoded > 0.95 and raw < 0.8, (encoded, raw)


def test_the_cnn_learns_which_half_of_the_image_is_lit(tmp_path):
    import torch
    trainer_config = load_config("any_env_toys:image_env", overrides=[("vec.backend", "serial")])
    trainer = Trainer(trainer_config)
    try:
        encoder = trainer.policy.observation_encoder
        assert encoder is not None and type(encoder.parts[0]).__name__ == "ImageEncoder"
        assert trainer.storage.obs.dtype == torch.uint8      # the image is stored as uint8
    finally:
        trainer.close()
    assert _final_reward("any_env_toys:image_env", "auto", tmp_path) > 0.95


def test_dict_observations_with_an_action_mask_learn_and_never_take_masked_actions(tmp_path):
    # DictEnv raises on a masked action, so finishing is the masking check
    assert _final_reward("any_env_toys:dict_env", "auto", tmp_path) > 0.95


def test_action_masks_in_info_are_read_and_respected(tmp_path):
    """InfoMaskEnv raises on a masked action: the mask from info reaches the policy."""
    env = pv.make(any_env_toys.info_mask_env, backend="serial", num_envs=2, seed=0)
    assert set(env.structured_observation_space.spaces) == {"observation", "action_mask"}
    env.close()
    assert _final_reward("any_env_toys:info_mask_env", "auto", tmp_path) > 0.95


def test_the_nature_cnn_takes_atari_frames_either_layout():
    import torch
    from peregrine.train.encoders import build_encoder
    for shape in [(4, 84, 84), (84, 84, 4), (84, 84)]:
        space = spaces.Box(0, 255, shape, np.uint8)
        encoder = build_encoder(space)
        rows = torch.randint(0, 256, (3, int(np.prod(shape))), dtype=torch.uint8).float()
        assert encoder(rows).shape == (3, 512)
    with pytest.raises(ValueError, match="at least 36"):
        build_encoder(spaces.Box(0, 255, (8, 8, 3), np.uint8), "nature")


# ---- spaces through shared memory -------------------------------------------------

def _leaf():
    boxes = st.builds(
        lambda shape, dtype: spaces.Box(-1000, 1000, shape, dtype) if dtype != np.uint8
        else spaces.Box(0, 255, shape, dtype),
        st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
        st.sampled_from([np.float32, np.uint8, np.int32]))
    return st.one_of(boxes, st.integers(2, 50).map(spaces.Discrete),
                     st.integers(1, 6).map(spaces.MultiBinary),
                     st.lists(st.integers(2, 9), min_size=1, max_size=3).map(
                         lambda nvec: spaces.MultiDiscrete(nvec)))


def _space():
    return st.recursive(_leaf(), lambda children: st.one_of(
        st.dictionaries(st.sampled_from("abcde"), children, min_size=1, max_size=3).map(
            spaces.Dict),
        st.lists(children, min_size=1, max_size=3).map(lambda items: spaces.Tuple(items))),
        max_leaves=5)


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def _round_trip(space, seed):
    """Two envs in two blocks of one set of buffers (Serial splits rows as Multiprocessing
    does; the shared-memory path itself is the next test's)."""
    with pv.make(lambda: any_env_toys.SampleEnv(space), backend="serial", num_envs=2,
                 num_workers=2, seed=seed) as env:
        observations, _ = env.reset(seed=seed)
        unit_seed = pv.common.unit_seed
        for unit in range(2):
            space.seed(unit_seed(seed, unit))
            expected = space.sample()
            got = unflatten(observations[unit], space, cast=True)
            assert _same(expected, got), (space, expected, got)
        assert env.structured_observation_space == space


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=_space(), seed=st.integers(0, 2**31))
def test_any_nesting_of_spaces_round_trips_bit_exactly(space, seed):
    _round_trip(space, seed)


def nested_space():
    return spaces.Dict({
        "image": spaces.Box(0, 255, (6, 5, 3), np.uint8),
        "pair": spaces.Tuple([spaces.Discrete(7, start=-3), spaces.MultiBinary(4)]),
        "vector": spaces.Box(-5, 5, (2, 3), np.float32)})


def nested_sample_env():
    return any_env_toys.SampleEnv(nested_space())


def test_nested_and_image_observations_round_trip_through_shared_memory():
    space = nested_space()
    with pv.make(nested_sample_env, backend="multiprocessing", num_envs=2, num_workers=2,
                 seed=11, overwork=True) as env:
        observations, _ = env.reset(seed=11)
        for unit in range(2):
            space.seed(pv.common.unit_seed(11, unit))
            assert _same(space.sample(), unflatten(observations[unit], space, cast=True))
    image = spaces.Box(0, 255, (6, 5, 3), np.uint8)
    with pv.make(lambda: any_env_toys.SampleEnv(image), backend="serial", num_envs=1) as env:
        assert env.observations.dtype == np.uint8       # an image alone stays uint8


# ---- checkpoints name their env ---------------------------------------------------------

def _cli(*args, timeout=300):
    result = subprocess.run([sys.executable, "-m", "peregrine.cli", *args],
                            capture_output=True, text=True, cwd=TESTS, timeout=timeout,
                            env={**os.environ, "PYTHONPATH": str(TESTS)})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_eval_render_and_resume_of_an_emulated_run_need_no_env_name(tmp_path):
    pytest.importorskip("pygame")   # Gymnasium's CartPole draws with pygame
    run = tmp_path / "run"
    _cli("train", "gym:CartPole-v1", "--detach", "--run-dir", str(run), "--total-steps", "2048",
         "--vec.num-envs", "4", "--env.wrappers", '[{name = "TimeLimit", max_episode_steps = 50}]')
    evaluated = json.loads(_cli("eval", "--policy", str(run), "--episodes", "3", "--json"))
    assert evaluated["env"] == "gym:CartPole-v1" and evaluated["episodes"] == 3
    assert evaluated["mean"]["episode_length"] <= 50          # the recorded wrapper applies
    out = tmp_path / "episode.gif"
    headless = {k: v for k, v in os.environ.items()
                if k not in ("DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "SDL_VIDEODRIVER")}
    rendered = subprocess.run([sys.executable, "-m", "peregrine.cli", "render", "--policy",
                               str(run), "--out", str(out), "--every", "5"],
                              capture_output=True, text=True, cwd=TESTS, timeout=300,
                              env={**headless, "PYTHONPATH": str(TESTS)})
    assert rendered.returncode == 0, rendered.stderr
    assert "XDG_RUNTIME_DIR" not in rendered.stderr       # SDL's line on a headless machine
    from PIL import Image
    assert Image.open(out).n_frames >= 2
    resumed = _cli("train", "--resume", str(run), "--total-steps", "4096", "--detach")
    assert "4,096 steps" in resumed


def test_render_draws_the_state_an_emulated_episode_ended_in():
    """The GIF's last frame was the step before the end (the env had reset by the time
    it could be drawn): a goal reached looked like a goal missed."""
    from peregrine.cli.render import _episode_frames
    from peregrine.vector.emulation import emulate

    class DrawnChain(any_env_toys._Chain):
        def render(self):       # the position as the image's one value
            return np.full((2, 2, 3), self.position, np.uint8)
    unit = emulate(gym.wrappers.TimeLimit(DrawnChain(4), max_episode_steps=16), seed=0)

    def right(observations):
        return np.ones(1, np.int64)
    frames, steps = _episode_frames(unit, right, unit.env.render, every=3, limit=100)
    assert steps == 4
    assert [int(frame[0, 0, 0]) for frame in frames] == [0, 3, 4]     # start, every 3, end
    unit.close()


class _Drawing(any_env_toys._Chain):
    """A chain that draws (render_mode "rgb_array"), or fails to when `broken`."""

    def __init__(self, render_mode=None, broken=False):
        super().__init__(4)
        self.render_mode, self.broken = render_mode, broken

    def render(self):
        if self.broken:
            raise RuntimeError("no OpenGL context\nsecond line")
        drawn.append(os.environ.get("MUJOCO_GL"))
        return np.zeros((4, 4, 3), np.uint8)


drawn: list = []


def drawing_chain(render_mode=None, broken=False):
    return _Drawing(render_mode, broken)


def test_render_says_which_env_could_not_draw_and_picks_egl_for_mujoco_headless(
        tmp_path, monkeypatch, capsys):
    """An env whose render() raised ended `peregrine render` in a traceback (MuJoCo's
    FatalError without OpenGL); on a machine without a display render now lets MuJoCo
    draw through EGL (MUJOCO_GL=egl) unless the user chose a backend."""
    from peregrine.cli import main
    for name in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.setenv(name, "")      # restored after the test, then cleared
        monkeypatch.delenv(name)
    target = f"{__name__}:drawing_chain"
    assert main(["render", target, "--out", str(tmp_path / "a.gif"), "--steps", "2"]) == 0
    assert drawn and set(drawn) == {"egl"}
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    drawn.clear()
    assert main(["render", target, "--out", str(tmp_path / "b.gif"), "--steps", "2"]) == 0
    assert set(drawn) == {"osmesa"}                                  # the user's choice
    capsys.readouterr()
    assert main(["render", target, "--out", str(tmp_path / "c.gif"),
                 "--env.broken", "true"]) == 2
    err = capsys.readouterr().err
    assert f"{target} could not draw a frame (render_mode 'rgb_array'): RuntimeError: no " \
           f"OpenGL context (MuJoCo draws with MUJOCO_GL=osmesa" in err
    assert "Traceback" not in err and not (tmp_path / "c.gif").exists()


def test_an_emulated_env_resumes_from_fresh_episodes(tmp_path):
    """Without get_state an emulated env cannot restore episodes in progress: a resume
    continues the counters and weights, and the envs start fresh episodes."""
    config = load_config("any_env_toys:chain_env", overrides=[
        *QUIET, ("vec.backend", "serial"), ("vec.num_envs", 2), ("train.total_steps", 256),
        ("train.horizon", 64)])
    train(config, tmp_path / "run", overwrite=True)
    trainer = Trainer(config)
    try:
        assert trainer.exact_resume is False
        from peregrine.train import checkpoint
        trainer.load_state_dict(checkpoint.load(tmp_path / "run"))
        assert trainer.updates == 2 and bool(trainer.rollout_state.starts.all())
        assert np.all(trainer.env.observations == 0.0)      # every corridor back at its start
    finally:
        trainer.close()


def test_encoders_work_with_the_lstm_and_bf16(tmp_path):
    _, summary = _train("any_env_toys:image_env", [
        ("vec.backend", "serial"), ("train.total_steps", 512), ("train.horizon", 32),
        ("train.update_epochs", 1), ("policy.lstm", True), ("policy.bptt_horizon", 8),
        ("train.precision", "bf16")], tmp_path / "run")
    assert summary["status"] == "finished" and summary["global_step"] == 512


def test_observation_normalisation_of_encoded_rows_is_refused():
    config = load_config("any_env_toys:dict_env", overrides=[
        ("vec.backend", "serial"), ("train.normalize_obs", True)])
    with pytest.raises(ValueError, match="NormalizeObservation"):
        Trainer(config)


def test_ranks_of_an_emulated_env_never_share_a_seed():
    """Emulated envs are seeded one unit per env: rank r's first env continues rank r-1's
    last (with one unit per worker, ranks would repeat each other's streams)."""
    from peregrine.train.distributed import units_per_rank
    from peregrine.vector.common import unit_seed
    config = load_config("gym:CartPole-v1", overrides=[("vec.num_envs", 4),
                                                       ("vec.num_workers", 2)])
    per_rank = units_per_rank(config)
    assert per_rank == 4
    seeds = [unit_seed(unit_seed(7, rank * per_rank), env) for rank in range(3)
             for env in range(4)]
    assert len(set(seeds)) == 12
    assert units_per_rank(load_config("cartpole")) == 1
    assert units_per_rank(load_config("cartpole", overrides=[
        ("vec.backend", "multiprocessing"), ("vec.num_workers", 2)])) == 2


def test_the_profiler_measures_an_emulated_env(tmp_path):
    out = tmp_path / "profile.json"
    _cli("profile", "gym:CartPole-v1", "--seconds", "0.5", "--warmup", "0.2", "--num-envs", "4",
         "--no-artifact", "--json", str(out))
    artifact = json.loads(out.read_text())
    assert artifact["env"] == "gym:CartPole-v1" and artifact["setup"]["rows"] == 4
    assert artifact["steady_state"]["steps_per_sec"] > 0
