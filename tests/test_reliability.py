"""Issue 35: nothing a user owns is lost, nothing wrong passes silently, and every
failure says what to do. One test (or a few) per case of the issue:

1. a /dev/shm too small for the Multiprocessing buffers (refused before workers start,
   naming `docker run --shm-size`; a SIGBUS names shared memory);
2. a user's files in checkpoints/ or tensorboard/ are never removed without --overwrite;
3. an interrupted `peregrine render` leaves an existing --out as it was;
4. emulated envs' non-finite observations (NaN, None, 1e300) and rewards beyond float32;
5. checkpoints with non-finite weights or nonsensical counters are refused where loaded;
6. config values keep TOML's types (no silent "1e3" -> 1000, "off" -> False), file named;
7. messages that say what happened (a damaged length field, a raw pickle, a full disk
   during a metrics write, a minibatch larger than the batch);
8. advice a CLI user can follow (vec.num_workers instead of overwork=True).

Case 9 (elastic restarts) is benchmarks/stress_elastic_restart.py, outside the suite.
"""
from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from peregrine.cli import main as cli_main
from peregrine.train.config import load_config
from peregrine.train.ppo import Trainer

pytestmark = pytest.mark.timeout(240)

SRC_DIR = str(Path(__file__).resolve().parent.parent / "src")
TINY = ["--vec.num-envs", "8", "--train.tensorboard", "false", "--train.stop-return", "0"]
SMALL = [("vec.num_envs", 4), ("train.horizon", 8), ("train.minibatch_size", 32),
         ("train.update_epochs", 1), ("train.total_steps", 64)]


@pytest.fixture(scope="module")
def payload():
    trainer = Trainer(load_config("cartpole", overrides=SMALL))
    trainer.update()
    state = trainer.state_dict()
    trainer.close()
    return state


# ---- case 2: a user's files are not a crashed attempt ---------------------------------------------

@pytest.mark.parametrize("folder, names", [
    ("checkpoints", ["best_model_I_want_to_keep.pt", "NOTES.txt"]),
    ("tensorboard", ["my_plots.ipynb"])])
def test_user_files_inside_a_run_folder_are_kept_without_overwrite(tmp_path, capsys, folder,
                                                                     names):
    run = tmp_path / "run"
    (run / folder).mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"updates": 1}\n')
    for name in names:
        (run / folder / name).write_text("mine")
    assert cli_main(["train", "cartpole", *TINY, "--detach", "--run-dir", str(run),
                     "--total-steps", "256"]) == 2
    err = capsys.readouterr().err
    assert "holds no Peregrine run" in err and "--overwrite" in err, err
    assert sorted(p.name for p in (run / folder).iterdir()) == sorted(names)
    assert (run / "metrics.jsonl").read_text() == '{"updates": 1}\n'


def test_a_crashed_attempt_with_only_run_files_is_still_cleaned(tmp_path):
    from peregrine.train import run_dir
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / f".latest.pt.tmp{os.getpid()}").write_bytes(b"half")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1.host.1.0").write_bytes(b"x")
    (run / "metrics.jsonl").write_text("{}\n")
    assert run_dir.describe(run) == "attempt"
    run_dir.claim_new(run).release()
    assert sorted(p.name for p in run.iterdir()) == ["run.lock"]


# ---- case 3: an interrupted render keeps the existing output -------------------------------------

def test_ctrl_c_while_a_gif_is_written_keeps_the_previous_file(tmp_path, monkeypatch):
    from PIL import Image
    out = tmp_path / "episode.gif"
    out.write_bytes(b"GIF89a previous render")
    real_save = Image.Image.save

    def interrupted_save(self, fp, *args, **kwargs):
        real_save(self, fp, *args, **kwargs)     # a half-written file, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(Image.Image, "save", interrupted_save)
    assert cli_main(["render", "drone_swarm", "--out", str(out), "--steps", "4",
                     "--size", "64"]) == 130       # "interrupted"
    assert out.read_bytes() == b"GIF89a previous render"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episode.gif"]   # no temporary left


def test_ctrl_c_while_an_emulated_gif_is_written_leaves_no_temporary(tmp_path, monkeypatch):
    from PIL import Image

    from peregrine.cli.render import write_gif
    out = tmp_path / "episode.gif"
    out.write_bytes(b"GIF89a previous render")

    def interrupted_save(self, fp, *args, **kwargs):
        Path(fp).write_bytes(b"GIF89a half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Image.Image, "save", interrupted_save)
    frames = [np.zeros((8, 8, 3), np.uint8)] * 2
    with pytest.raises(KeyboardInterrupt):
        write_gif(frames, str(out), 80)
    assert out.read_bytes() == b"GIF89a previous render"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episode.gif"]


# ---- case 4: emulated envs' values that the float32 buffers cannot hold ---------------------------

class _Values(gym.Env):
    """Returns the observation and reward it is given, whatever they are."""

    def __init__(self, observation, reward=0.0, space=None):
        self.observation_space = space or gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.observation, self.reward = observation, reward
        self.steps = 0

    def reset(self, seed=None, options=None):
        return np.zeros(3), {}

    def step(self, action):
        self.steps += 1
        return self.observation, self.reward, False, False, {}


@pytest.mark.parametrize("observation", [
    np.array([0.0, np.nan, 1.0]), np.array([0.0, 1e300, 1.0]), np.array([0.0, -np.inf, 1.0]),
    np.array([0.0, None, 1.0], dtype=object)], ids=["nan", "1e300", "-inf", "None"])
def test_non_finite_emulated_observations_are_refused(observation):
    from peregrine.vector.emulation import emulate
    unit = emulate(_Values(observation), seed=0)
    try:
        with pytest.raises(ValueError, match=r"env 0 returned an observation .*not finite"):
            unit.step(np.zeros(unit.actions.shape, unit.actions.dtype))
    finally:
        unit.close()


def test_non_finite_leaf_of_a_dict_observation_is_refused():
    from peregrine.vector.emulation import emulate
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(3),
                             "b": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)})

    class DictValues(_Values):
        def reset(self, seed=None, options=None):
            return {"a": 1, "b": np.zeros(2)}, {}

    unit = emulate(DictValues({"a": 1, "b": np.array([1.0, np.nan])}, space=space), seed=0)
    try:
        with pytest.raises(ValueError, match="not finite"):
            unit.step(np.zeros(unit.actions.shape, unit.actions.dtype))
    finally:
        unit.close()


@pytest.mark.parametrize("reward", [1e300, -1e39, np.float64(3.5e38)])
def test_rewards_beyond_float32_are_refused(reward):
    from peregrine.vector.emulation import emulate
    unit = emulate(_Values(np.zeros(3), reward), seed=0)
    try:
        with pytest.raises(ValueError, match=r"env 0 returned a reward .*float32"):
            unit.step(np.zeros(unit.actions.shape, unit.actions.dtype))
    finally:
        unit.close()


def test_large_finite_values_that_fit_float32_pass():
    from peregrine.vector.emulation import emulate
    unit = emulate(_Values(np.array([3e38, -3e38, 1.0]), 3e38), seed=0)
    try:
        observations, rewards, *_ = unit.step(np.zeros(unit.actions.shape, unit.actions.dtype))
        assert np.isfinite(observations).all() and rewards[0] == np.float32(3e38)
    finally:
        unit.close()


