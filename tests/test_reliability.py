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

9. an elastic restart whose ranks read the killed ranks' Gloo addresses (a
   deterministic test here; 20 kill-and-restart trials in
   benchmarks/stress_elastic_restart.py, outside the suite).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from peregrine.cli import main as cli_main
from peregrine.train import checkpoint
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


# ---- case 1: a /dev/shm too small for the shared buffers ---------------------------------------

BIG_ENV = textwrap.dedent("""
    import gymnasium as gym
    import numpy as np

    class Big(gym.Env):
        \"\"\"16 KiB observations that end every step (final_observations written too).\"\"\"
        observation_space = gym.spaces.Box(-1, 1, (4096,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            return np.zeros(4096, np.float32), {}

        def step(self, action):
            return np.ones(4096, np.float32), 0.0, True, False, {}

    def make():
        return Big()
""")
SMALL_SHM = "mount -t tmpfs -o size=64m tmpfs /dev/shm"
HOW_TO_RUN = ("sudo unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64m tmpfs "
              "/dev/shm && python -m pytest tests/test_reliability.py -k small_dev_shm'")


def _private_small_shm_or_skip():
    if shutil.which("unshare") is None:
        pytest.skip(f"needs unshare(1) for a private mount namespace; run: {HOW_TO_RUN}")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SMALL_SHM],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace here ({probe.stderr.strip()}); "
                    f"run: {HOW_TO_RUN}")


def test_a_small_dev_shm_is_refused_before_workers_start_naming_shm_size(tmp_path):
    """Docker's default 64 MiB /dev/shm (a private mount namespace here) and buffers of
    ~128 MiB (4096 rows x 16 KiB observations and final observations): before, a
    worker died of SIGBUS with no word about shared memory."""
    _private_small_shm_or_skip()
    (tmp_path / "bigenv.py").write_text(BIG_ENV)
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC_DIR, str(tmp_path)]))
    command = [sys.executable, "-m", "peregrine", "train", "bigenv:make", *TINY, "--detach",
               "--vec.backend", "multiprocessing", "--vec.num-workers", "1",
               "--vec.num-envs", "4096", "--total-steps", "1e6",
               "--run-dir", str(tmp_path / "run")]
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                             SMALL_SHM + ' && exec "$@"', "sh", *command],
                            capture_output=True, text=True, env=environ, timeout=180)
    assert result.returncode == 2, result.stderr[-3000:]
    err = result.stderr
    assert "shared memory" in err and "/dev/shm" in err, err
    assert "docker run --shm-size=192m" in err, err      # ~128 MiB of buffers, a quarter on top
    assert "Traceback" not in err and "SIGBUS" in err, err


def test_shm_size_advice_is_computed_from_the_buffers():
    from peregrine.vector.processes import shm_size_advice
    mib = 1 << 20
    assert shm_size_advice(100 * mib, (64 * mib, 64 * mib)) == "docker run --shm-size=128m"
    assert shm_size_advice(700 * mib, (64 * mib, 64 * mib)) == "docker run --shm-size=896m"
    assert shm_size_advice(800 * mib, (64 * mib, 64 * mib)) == "docker run --shm-size=1g"
    assert shm_size_advice(90 * mib, (4 * mib, 64 * mib)) == "docker run --shm-size=192m"


def test_a_worker_killed_by_sigbus_says_shared_memory_ran_out():
    import signal

    from peregrine.vector import WorkerDiedError, make
    env = make("gym:CartPole-v1", backend="multiprocessing", num_envs=2, num_workers=1, seed=0)
    try:
        env.reset(seed=0)
        os.kill(env._workers[0].process.pid, signal.SIGBUS)
        with pytest.raises(WorkerDiedError) as error:
            for _ in range(200):
                env.step(np.zeros(env.actions.shape, env.actions.dtype))
        message = str(error.value)
        assert "SIGBUS" in message and "shared memory ran out" in message, message
        assert "--shm-size=" in message, message
    finally:
        env.close()


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


def test_a_checkpoint_write_cut_short_keeps_the_last_and_names_its_leftover_as_run_dir_knows(
        tmp_path, monkeypatch):
    """Ctrl-C between writing and renaming: the previous checkpoint stays, no temporary
    file stays, and the temporary file's name is the one run_dir takes for a crashed
    attempt's leftover (a second copy of that naming would drift)."""
    from peregrine.train import checkpoint, run_dir
    path = run_dir.checkpoint_path(tmp_path)
    checkpoint.save(path, {"updates": 1})
    written = []

    def interrupted(fd):
        written.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, {"updates": 2})
    assert os.listdir(path.parent) == ["latest.pt"]
    assert checkpoint.load(path)["updates"] == 1
    assert written[0].startswith(run_dir.RUN_FOLDER_PREFIXES["checkpoints"]), written


def test_a_crashed_attempt_with_only_run_files_is_still_cleaned(tmp_path):
    from peregrine.train import run_dir
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / f".latest.partial{os.getpid()}.pt").write_bytes(b"half")
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


# ---- case 5: non-finite weights and nonsensical counters ----------------------------------------

def test_eval_of_a_checkpoint_with_nan_weights_is_refused(tmp_path, payload, capsys):
    broken = dict(payload, policy={k: v.clone() for k, v in payload["policy"].items()})
    name = next(k for k, v in broken["policy"].items() if v.is_floating_point())
    broken["policy"][name][0] = float("nan")
    path = tmp_path / "nan.pt"
    checkpoint.save(path, broken)
    assert cli_main(["eval", "cartpole", "--policy", str(path), "--episodes", "2"]) != 0
    err = capsys.readouterr().err
    assert "not finite" in err and name in err, err


@pytest.mark.parametrize("key, value", [("updates", -3), ("global_step", -1),
                                        ("updates", 2.5), ("episodes", True)])
def test_a_checkpoint_with_a_nonsensical_counter_is_refused(tmp_path, payload, key, value):
    path = tmp_path / "counter.pt"
    checkpoint.save(path, dict(payload, **{key: value}))
    with pytest.raises(ValueError, match=rf"counter.pt' has {key} = {value!r}"):
        checkpoint.load(path)


def test_resume_of_a_run_whose_checkpoint_counts_backwards_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main(["train", "cartpole", *TINY, "--detach", "--run-dir", str(run),
                     "--total-steps", "512", "--train.horizon", "32"]) == 0
    state = checkpoint.load(run)
    checkpoint.save(run / "checkpoints" / "latest.pt", dict(state, updates=-3))
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run), "--detach", "--total-steps", "2048"]) == 2
    assert "updates = -3" in capsys.readouterr().err


# ---- case 6: config values keep TOML's types -----------------------------------------------------

def _config_file(tmp_path, text, encoding="utf-8"):
    path = tmp_path / "my.toml"
    path.write_bytes(text.encode(encoding))
    return path


@pytest.mark.parametrize("section, line, key", [
    ("vec", 'num_envs = "1e3"', "vec.num_envs"),
    ("train", 'anneal_lr = "off"', "train.anneal_lr"),
    ("train", "anneal_lr = 1", "train.anneal_lr"),
    ("train", 'learning_rate = "3e-4"', "train.learning_rate"),
    ("env", 'gravity = "9.8"', "env.gravity")])
def test_a_toml_value_of_another_type_is_refused_naming_the_key_and_file(tmp_path, section,
                                                                          line, key):
    path = _config_file(tmp_path, f"[{section}]\n{line}\n")
    with pytest.raises(ValueError) as error:
        load_config("cartpole", config_file=path)
    assert key in str(error.value) and "my.toml" in str(error.value), str(error.value)


def test_toml_values_of_the_right_type_are_taken():
    config = load_config("cartpole", overrides=[])
    assert config.train.anneal_lr in (True, False)


def test_an_emulated_envs_toml_string_stays_a_string(tmp_path):
    path = _config_file(tmp_path, '[env]\nname = "gym:CartPole-v1"\nmax_episode_steps = "100"\n')
    config = load_config(config_file=path)
    assert config.env["max_episode_steps"] == "100"


@pytest.mark.parametrize("tokens, key, expected", [
    (["--vec.num-envs", "64"], ("vec", "num_envs"), 64),
    (["--vec.num-envs", "1_024"], ("vec", "num_envs"), 1024),
    (["--train.total-steps", "1e9"], ("train", "total_steps"), 10**9),
    (["--train.learning-rate", "3e-4"], ("train", "learning_rate"), 3e-4),
    (["--train.anneal-lr", "false"], ("train", "anneal_lr"), False),
    (["--train.run-dir", "2024"], ("train", "run_dir"), "2024"),
    (["--policy.activation", "relu"], ("policy", "activation"), "relu"),
    (["--vec.num-workers", "auto"], ("vec", "num_workers"), 1)])
def test_command_line_tokens_are_read_as_toml_literals(tokens, key, expected):
    config = load_config("cartpole", overrides=tokens)
    assert getattr(getattr(config, key[0]), key[1]) == expected


@pytest.mark.parametrize("value", ["off", "yes", "1", "True"])
def test_command_line_bools_are_tomls_true_and_false(value):
    with pytest.raises(ValueError, match=rf"train.anneal_lr must be true or false, got '{value}'"):
        load_config("cartpole", overrides=["--train.anneal-lr", value])


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    path = _config_file(tmp_path, '[train]\n# r\u00e9glages\nhorizon = 32\n', "latin-1")
    with pytest.raises(ValueError) as error:
        load_config("cartpole", config_file=path)
    assert "my.toml" in str(error.value) and "UTF-8" in str(error.value), str(error.value)


# ---- case 7: messages that say what happened ---------------------------------------------------

def test_a_flipped_bit_in_the_length_field_is_not_called_truncation(tmp_path, payload):
    path = tmp_path / "flipped.pt"
    checkpoint.save(path, payload)
    raw = bytearray(path.read_bytes())
    raw[len(checkpoint.MAGIC) + 4] ^= 1          # bit 32 of the payload length
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError) as error:
        checkpoint.load(path)
    assert "truncated" not in str(error.value)
    assert "length field" in str(error.value) and "damaged" in str(error.value)


def test_a_truly_truncated_checkpoint_is_still_called_truncated(tmp_path, payload):
    path = tmp_path / "cut.pt"
    checkpoint.save(path, payload)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="is truncated"):
        checkpoint.load(path)


def test_a_raw_pickle_is_refused_with_a_reason(tmp_path):
    data = pickle.dumps({"policy": {"weight": [1.0, 2.0]}})
    path = tmp_path / "raw.pt"
    path.write_bytes(checkpoint.HEADER.pack(checkpoint.MAGIC, len(data),
                                            hashlib.sha256(data).digest()) + data)
    with pytest.raises(ValueError) as error:
        checkpoint.load(path)
    message = str(error.value)
    assert "decoded: ." not in message and "decoded: It" not in message, message
    assert "pickle" in message, message


def test_a_full_disk_during_a_metrics_write_names_the_file(tmp_path):
    from peregrine.train.run_log import RunLogger
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    logger = RunLogger(tmp_path, [], dashboard=False)
    try:
        with pytest.raises(OSError) as error:
            logger.update({"updates": 1, "global_step": 8})
    finally:    # its file closed here, not by a later test's garbage collection
        with contextlib.suppress(OSError):
            logger.close("failed")
    assert "metrics.jsonl" in str(error.value) and error.value.errno == 28, str(error.value)


def test_a_minibatch_larger_than_the_batch_is_named(capsys):
    trainer = Trainer(load_config("cartpole", overrides=[
        ("vec.num_envs", 4), ("train.horizon", 8), ("train.minibatch_size", 512),
        ("train.total_steps", 64)]))
    trainer.close()
    err = capsys.readouterr().err
    assert "train.minibatch_size (512)" in err and "32" in err, err


def _start_warnings(capsys, factory, num_envs: int = 2, horizon: int = 8) -> str:
    """What a Trainer of `factory`'s env says on stderr as it starts (a tiny serial run)."""
    config = load_config(factory, overrides=[
        ("vec.num_envs", num_envs), ("train.horizon", horizon),
        ("train.minibatch_size", num_envs * horizon),
        ("train.total_steps", num_envs * horizon), ("vec.backend", "serial")])
    Trainer(config).close()
    return capsys.readouterr().err


def _frames(shape):
    """A Gymnasium env class whose observations are uint8 Boxes of `shape`."""
    import gymnasium
    from gymnasium import spaces

    class Frames(gymnasium.Env):
        observation_space = spaces.Box(0, 255, shape, np.uint8)
        action_space = spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return np.zeros(shape, np.uint8), {}

        def step(self, action):
            return np.zeros(shape, np.uint8), 0.0, False, False, {}
    return Frames


@pytest.mark.parametrize("low, high, warned", [(0.0, 10.0, True), (-2.0, 2.0, False),
                                              (-1.0, 1.0, False), (-100.0, 100.0, True)])
def test_box_actions_far_from_the_gaussian_start_are_named(capsys, low, high, warned):
    """Pendulum's torque given in [0, 10] trained with half its actions clipped to 0 and
    the top of the range never tried, without a word."""
    import gymnasium
    err = _start_warnings(capsys, lambda: gymnasium.wrappers.RescaleAction(
        gymnasium.make("Pendulum-v1"), low, high))
    assert ("the Box action space's bounds" in err) == warned, err
    if warned:
        assert f"[{low:g}, {high:g}] (component 0)" in err and '"RescaleAction"' in err


@pytest.mark.parametrize("shape, warned", [((2, 40, 40, 1), True), ((40, 40, 8), True),
                                           ((4, 40, 40), False), ((40, 40, 3), False)])
def test_pictures_the_cnn_cannot_take_are_named(capsys, shape, warned):
    """A stack of keep_dim grayscale frames trained an MLP over every pixel, silently."""
    err = _start_warnings(capsys, _frames(shape))
    assert (f"the observation of shape {shape} is read flat by the MLP" in err) == warned, err


@pytest.mark.parametrize("shape, warned", [((210, 160, 3), True), ((84, 84, 4), False)])
def test_an_encoder_too_large_to_train_quickly_is_named(capsys, shape, warned):
    """Cooperative pong's 280 x 480 frames made a 57M-parameter CNN without a word; raw
    Atari frames give 11.6M, 84 x 84 ones 1.7M."""
    err = _start_warnings(capsys, _frames(shape), num_envs=1, horizon=4)
    assert ("the observation encoder has 11.6M parameters (a CNN over images of (210, 160, 3))"
            in err) == warned, err


# ---- case 8: advice a CLI user can follow ------------------------------------------------------

def test_too_many_workers_names_the_config_key(tmp_path, capsys):
    """More workers than cores is a warning (the run goes ahead; tests/test_cores.py),
    whose advice names what the CLI can change (overwork= is for Python callers)."""
    from peregrine.vector.common import CoresWarning, available_cores
    workers = available_cores() * 2
    with pytest.warns(CoresWarning) as caught:
        code = cli_main(["train", "gym:CartPole-v1", *TINY, "--detach", "--run-dir",
                         str(tmp_path / "run"), "--vec.backend", "multiprocessing",
                         "--vec.num-envs", str(workers), "--vec.num-workers", str(workers),
                         "--total-steps", "256"])
    err = capsys.readouterr().err
    assert code == 0, err
    # the CoresWarning among what was caught (another test's ResourceWarning may be
    # collected in the same block)
    message = str(next(w.message for w in caught if issubclass(w.category, CoresWarning)))
    assert f"--vec.num-workers {available_cores()}" in message and "vec.num_workers" in message


# ---- case 9: an elastic restart gets a store of its own -----------------------------------------

_RESTARTED_RANKS = textwrap.dedent("""
    import os, sys, time
    from peregrine.train.config import load_config
    from peregrine.train.distributed import DataParallel
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 1 and rank == 0:
        time.sleep(3)    # the restarted rank 0 publishes its address after rank 1 looks
    dp = DataParallel(load_config("cartpole", overrides=[("train.dist_timeout", 20)]))
    print(f"attempt {attempt} rank {rank}: process group up", flush=True)
    if attempt == 0 and rank == 1:
        os._exit(3)      # a rank dies: torchrun restarts every rank
    time.sleep(1 if attempt == 0 else 0)
    dp.close()
""")


def test_restarted_ranks_never_read_the_killed_ranks_addresses(tmp_path):
    """torchrun keeps its rendezvous store across restarts; the default group's keys
    held the dead ranks' Gloo addresses, and a restarted rank that looked before its
    peer republished failed with 'Gloo connectFullMesh ... Connection refused'."""
    script = tmp_path / "ranks.py"
    script.write_text(_RESTARTED_RANKS)
    environ = dict(os.environ, PYTHONPATH=SRC_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", "--max-restarts", "1", str(script)],
                            capture_output=True, text=True, env=environ, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "attempt 1 rank 0: process group up" in output
    assert "attempt 1 rank 1: process group up" in output
    assert "Connection refused" not in output


# ---- the sweep's cases that held (issue 35), kept where cheap ---------------------------------

def test_a_unicode_run_directory_trains_and_resumes(tmp_path, capsys):
    run = tmp_path / "runs ü 飞鸟" / "cartpole é"
    assert cli_main(["train", "cartpole", *TINY, "--detach", "--run-dir", str(run),
                     "--total-steps", "512"]) == 0
    assert cli_main(["train", "--resume", str(run), "--detach", "--total-steps", "1024"]) == 0
    assert checkpoint.load(run)["global_step"] == 1024


def test_a_symlinked_run_directory_writes_into_its_target(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target, target_is_directory=True)
    assert cli_main(["train", "cartpole", *TINY, "--detach", "--run-dir",
                     str(tmp_path / "link"), "--total-steps", "512"]) == 0
    assert (target / "checkpoints" / "latest.pt").is_file()
    assert (tmp_path / "link").is_symlink()


def test_two_evals_of_one_checkpoint_at_once(tmp_path):
    run = tmp_path / "run"
    assert cli_main(["train", "cartpole", *TINY, "--detach", "--run-dir", str(run),
                     "--total-steps", "512"]) == 0
    environ = dict(os.environ, PYTHONPATH=SRC_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "peregrine", "eval", "cartpole", "--policy",
               str(run / "checkpoints" / "latest.pt"), "--episodes", "4", "--json"]
    jobs = [subprocess.Popen(command, env=environ, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [job.communicate(timeout=120) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], results
    first, second = (json.loads(out) for out, _ in results)
    for record in (first, second):
        record.pop("seconds", None)               # wall time differs, nothing else
    assert first == second                        # same checkpoint, same seed: same returns
