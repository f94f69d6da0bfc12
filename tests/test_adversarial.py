"""Bad input at every public entry point: a clear error naming the problem, or a
documented safe behaviour; never a crash, a hang, a leak or a silent wrong answer.

Cases already covered elsewhere are not repeated here: the env contract
(tests/test_env_contract.py: action dtype/shape/strides/range, config fields,
caller buffers of wrong dtype/shape/stride, num_envs/num_threads 0, negative
seeds, two threads stepping one env), multiprocessing failures
(tests/test_vector_failures.py: killed and raising workers, Ctrl-C, dead
parent), the fuzzer (tests/fuzz_native.py, under sanitizers in
test_sanitizers.py: hostile floats, every config extreme, the raw C binding),
damaged checkpoints (test_train_checkpoint.py) and damaged, foreign and stale
monitor files (test_monitor.py).
"""
from __future__ import annotations

import os
import re
import resource
import signal
import textwrap
import threading
import time
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import peregrine
import peregrine.vector as pv
from peregrine.cli import main as cli_main
from peregrine.envs.native import batch as native_env
from polling import poll_until
from test_vector_helpers import pid_alive, record_segments, shm_segments

pytestmark = pytest.mark.timeout(120)  # a hang fails the test instead of the suite


def actions_for(env, seed=0):
    env.action_space.seed(seed)
    return np.ascontiguousarray(env.action_space.sample())


# ---- actions ---------------------------------------------------------------------------

def test_read_only_actions_are_accepted_and_step_like_writable_ones():
    """Safe behaviour: actions are only read, so a read-only array is fine."""
    with peregrine.make("cartpole", num_envs=8, seed=0) as a, \
            peregrine.make("cartpole", num_envs=8, seed=0) as b:
        actions = actions_for(a)
        frozen = actions.copy()
        frozen.flags.writeable = False
        for _ in range(20):
            a.step(actions)
            b.step(frozen)
        np.testing.assert_array_equal(a.observations, b.observations)


@pytest.mark.parametrize("name", ["cartpole", "pendulum"])
def test_misaligned_actions_are_refused_by_the_binding(name):
    with peregrine.make(name, num_envs=8, seed=0) as env:
        good = actions_for(env)
        raw = np.zeros(good.nbytes + 1, np.uint8)
        misaligned = raw[1:].view(good.dtype).reshape(good.shape)
        misaligned[...] = good
        assert not misaligned.flags.aligned
        before = env.observations.copy()
        with pytest.raises(ValueError, match="actions is not aligned"):
            env.step(misaligned)
        np.testing.assert_array_equal(env.observations, before)


def test_scalar_actions_are_refused():
    with peregrine.make("cartpole", num_envs=8, seed=0) as env:
        with pytest.raises(ValueError, match=r"shape \(8,\)"):
            env.step(np.int32(0))


# ---- sizes -----------------------------------------------------------------------------

@pytest.mark.parametrize("num_envs", [-1, 2.0, 2**26 + 1, 2**31, 2**70, 1e12])
def test_negative_non_integer_or_huge_num_envs_is_refused_before_allocating(num_envs):
    message = r"num_envs must be an int in \[1, 67108864\]"
    with pytest.raises(ValueError, match=message):
        peregrine.make("cartpole", num_envs=num_envs)
    with pytest.raises(ValueError, match=message):
        gymnasium.make_vec("peregrine/CartPole-v1", num_envs=num_envs)


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
@pytest.mark.parametrize("name", ["num_envs", "num_workers", "num_threads"])
@pytest.mark.parametrize("value", [-1, 2.0, "4"])
def test_vector_backends_refuse_negative_or_non_integer_counts(backend, name, value,
                                                              monkeypatch):
    ours = record_segments(monkeypatch)
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1, got {value!r}"):
        pv.make("cartpole", backend=backend, **{"num_envs": 4, name: value})
    assert not ours & shm_segments()


@pytest.mark.parametrize("num_threads", [-1, 257, 10**6])
def test_num_threads_out_of_range(num_threads):
    with pytest.raises(ValueError, match=r"num_threads must be an int in \[1, 256\]"):
        peregrine.make("cartpole", num_envs=4, num_threads=num_threads)


def test_buffers_larger_than_ram_are_a_clear_memory_error(monkeypatch):
    """Refused up front: with overcommit the allocation itself would succeed and
    the first write would bring the OOM killer."""
    monkeypatch.setattr(native_env, "physical_memory", lambda: 1 << 20)
    with pytest.raises(MemoryError, match=r"100,000 rows need .* GiB of buffers, more than"):
        peregrine.make("cartpole", num_envs=100_000)
    peregrine.make("cartpole", num_envs=1000).close()   # 1000 rows fit in 1 MiB


def test_the_storage_estimate_counts_images_as_the_uint8_they_are_stored_in(monkeypatch):
    """An image is stored once, as uint8: PettingZoo's pistonball (20 agents of 457x120x3
    at 16 envs, 3.4 GB of storage) was refused as 25 GiB on a 23.5 GiB machine."""
    from peregrine.train.config import load_config
    from peregrine.train.ppo import check_memory
    config = load_config("cartpole", overrides=[("train.horizon", 64)])
    rows, pixels = 320, 457 * 120 * 3
    stored = 64 * rows * (pixels + (2 * 1 + 16) * 4)
    monkeypatch.setattr(native_env, "physical_memory", lambda: stored + 1)
    check_memory(config, rows, pixels, np.dtype(np.uint8), 1)
    with pytest.raises(MemoryError, match=r"rollout storage \(train.horizon x rows\) needs "
                                          r"about 12.6 GiB, more than this machine's 3.1 GiB"):
        check_memory(config, rows, pixels, np.dtype(np.float32), 1)   # normalised: float32
    with pytest.raises(MemoryError, match="rollout storage"):
        check_memory(config, rows + 1, pixels, np.dtype(np.uint8), 1)


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_vector_backends_refuse_buffers_larger_than_ram(backend, monkeypatch):
    def no_segment(*args, **kwargs):
        raise AssertionError("a shared-memory segment was created")

    from peregrine.vector import processes
    monkeypatch.setattr(processes.shared_memory, "SharedMemory", no_segment)
    with pytest.raises(MemoryError, match="more than this machine's"):
        pv.make("cartpole", backend=backend, num_envs=2**40)


# ---- seeds -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed, message", [
    (2**64, "less than 2\\*\\*64"), (2**70, "less than 2\\*\\*64"), (-1, "non-negative"),
    (1.5, "must be an int"), ("1", "must be an int"), (True, "must be an int")])
def test_bad_seeds_are_refused_everywhere(seed, message):
    with peregrine.make("cartpole", num_envs=4, seed=0) as env:
        with pytest.raises(ValueError, match=message):
            env.reset(seed=seed)
        with pytest.raises(ValueError, match=message):
            env.seed_streams(seed)
    with pytest.raises(ValueError, match=message):
        peregrine.make("cartpole", num_envs=4, seed=seed)
    with pv.make("cartpole", backend="serial", num_envs=4, num_workers=2) as env:
        with pytest.raises(ValueError, match=message):
            env.reset(seed=seed)


def test_the_binding_never_wraps_a_seed():
    with peregrine.make("cartpole", num_envs=4, seed=0) as env:
        for seed in (2**64, -1, 1.0):
            with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\)"):
                env._batch.seed(seed)
        largest = env.reset(seed=2**64 - 1)[0].copy()
        np.testing.assert_array_equal(env.reset(seed=np.uint64(2**64 - 1))[0], largest)
        assert not np.array_equal(env.reset(seed=0)[0], largest)


# ---- caller-owned buffers --------------------------------------------------------------

def _good_buffers(name="cartpole", num_envs=4):
    with peregrine.make(name, num_envs=num_envs, seed=0) as probe:
        return {n: np.zeros_like(getattr(probe, n)) for n in native_env.BUFFER_NAMES}


def test_overlapping_buffers_are_refused():
    good = _good_buffers()
    with pytest.raises(ValueError, match="'final_observations'.*'observations'.* overlap"):
        peregrine.make("cartpole", num_envs=4,
                       buffers=dict(good, final_observations=good["observations"]))
    flags = np.zeros(6, bool)
    with pytest.raises(ValueError, match="'terminals'.*'truncations'.* overlap"):
        peregrine.make("cartpole", num_envs=4,
                       buffers=dict(good, terminals=flags[:4], truncations=flags[2:]))
    # adjacent, not overlapping: fine
    peregrine.make("cartpole", num_envs=4, buffers=dict(
        good, terminals=np.zeros(8, bool)[:4], truncations=np.zeros(8, bool)[4:])).close()


def test_misaligned_buffers_are_refused():
    good = _good_buffers()
    raw = np.zeros(good["observations"].nbytes + 1, np.uint8)
    misaligned = raw[1:].view(np.float32).reshape(good["observations"].shape)
    with pytest.raises(ValueError, match=r"buffers\['observations'\] is not aligned"):
        peregrine.make("cartpole", num_envs=4, buffers=dict(good, observations=misaligned))


# ---- lifetime and threads --------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda env: env.step(np.zeros(4, np.int32)), lambda env: env.reset(),
    lambda env: env.reset(seed=1), lambda env: env.episode_stats(),
    lambda env: env.instance_stats(), lambda env: env.get_state(0),
    lambda env: env.set_state(0, [0.0]), lambda env: env.seed_streams(1)])
def test_every_call_after_close_says_the_env_is_closed(call):
    env = peregrine.make("cartpole", num_envs=4, seed=0)
    env.close()
    with pytest.raises(RuntimeError, match="cartpole env is closed"):
        call(env)
    env.close()   # still idempotent


def test_close_while_another_thread_steps_is_refused_and_the_env_survives():
    env = peregrine.make("cartpole", num_envs=1 << 16, seed=0, num_threads=2)
    actions = np.zeros(1 << 16, np.int32)
    stop = threading.Event()
    errors = []

    def hammer():
        while not stop.is_set():
            try:
                env.step(actions)
            except RuntimeError as error:   # the env was closed between two steps
                errors.append(str(error))
                return

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        for _ in range(200):
            try:
                env.close()
                break
            except RuntimeError as error:   # refused: the env stays open and stepping
                assert "while it is stepping" in str(error)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    env.close()
    # The stepping thread, if the close came between two of its steps, is told so.
    assert all("closed" in e for e in errors), errors
    with pytest.raises(RuntimeError, match="closed"):
        env.step(actions)


def test_serial_backend_after_close_is_an_error():
    env = pv.make("cartpole", backend="serial", num_envs=4, num_workers=2, seed=0)
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.step(np.zeros(4, np.int32))
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


# ---- vector workers that misbehave -----------------------------------------------------

class WrongShapeEnv(gymnasium.Env):
    """Declares a (3,) observation, returns (5,) from step."""
    observation_space = spaces.Box(-1, 1, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(5, np.float32), 0.0, False, False, {}


class TextRewardEnv(WrongShapeEnv):
    def step(self, action):
        return np.zeros(3, np.float32), "high", False, False, {}


class HangingEnv(WrongShapeEnv):
    """Steps normally twice, then never returns."""

    def __init__(self):
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > 2:
            time.sleep(3600)
        return np.zeros(3, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("env_class, message", [
    (WrongShapeEnv, r"observation of shape \(5,\) that does not fit its observation_space"),
    (TextRewardEnv, "reward that is not a number: 'high'")])
def test_emulated_env_breaking_its_spaces_is_named(env_class, message):
    with pv.make(env_class, backend="serial", num_envs=2, num_workers=2) as env:
        with pytest.raises(ValueError, match=message):
            env.step(np.zeros(2, env.single_action_space.dtype))
    with pv.make(env_class, backend="multiprocessing", num_envs=1) as env:
        segment = env._resources.shm.name.lstrip("/")
        with pytest.raises(pv.WorkerError, match=f"(?s)worker 0.*{message}"):
            env.step(np.zeros(1, env.single_action_space.dtype))
    assert segment not in shm_segments()


class OutOfRangeEnv(WrongShapeEnv):
    """Returns `value` for `space`: a value the space's integer type cannot mean."""

    def __init__(self, space, value):
        self.observation_space, self.value = space, value

    def reset(self, *, seed=None, options=None):
        return self.value, {}


IMAGE = spaces.Box(0, 255, (4, 4), np.uint8)


@pytest.mark.parametrize("space, value, message", [
    # a cast to uint8 used to wrap 300 to 44 and -5 to 251, and floor a [0, 1] image to 0
    (IMAGE, np.full((4, 4), 300), r"value at \[0\] is 300 \(int64\), which uint8 cannot hold"),
    (IMAGE, np.full((4, 4), -5.0), r"is -5.0 \(float64\), which uint8 cannot hold"),
    (IMAGE, np.full((4, 4), 0.5, np.float32), r"a float image in \[0, 1\] needs a float32 Box"),
    # a one-hot encoder used to clamp 7 to 4 and -1 to 0
    (spaces.Discrete(5), 7, r"the observation 7.0, not one of the whole numbers 0..4"),
    (spaces.Discrete(5, start=2), 1, r"not one of the whole numbers 2..6"),
    (spaces.Discrete(5), 2.5, r"the observation 2.5, not one of the whole numbers"),
    (spaces.MultiBinary(3), np.array([0, 2, 1]), r"whose value\[1\] is 2.0, not one of .* 0..1"),
    (spaces.Dict({"cell": spaces.MultiDiscrete([3] * 20), "x": spaces.Box(-1, 1, (2,))}),
     {"cell": np.full(20, 3), "x": np.zeros(2)}, r"whose cell\[0\] is 3.0, not one of .* 0..2"),
])
def test_integer_observations_outside_their_space_are_refused(space, value, message):
    with pytest.raises(ValueError, match="env 0 returned .*" + message):
        pv.make(lambda: OutOfRangeEnv(space, value), backend="serial", num_envs=1)


def test_integer_observations_inside_their_space_are_written_as_they_are():
    from peregrine.vector.spaces import FlatObservation
    image = FlatObservation(IMAGE)
    row = np.zeros(16, np.uint8)
    image.write(np.full((4, 4), 255.0), row)        # whole floats in range: exact
    assert (row == 255).all()
    cells = FlatObservation(spaces.Dict({"a": spaces.Discrete(3, start=-1),
                                         "b": spaces.MultiBinary(40)}))
    row = np.zeros(cells.size, np.float32)
    cells.write({"a": -1, "b": np.ones(40, np.int8)}, row)
    assert row[0] == -1 and (row[1:] == 1).all()
    batch = np.zeros((2, cells.size), np.float32)
    with pytest.raises(ValueError, match=r"\(row 1\) returned an observation whose b\[3\] is 2.0"):
        b = np.ones((2, 40), np.int8)
        b[1, 3] = 2
        cells.write_batch({"a": np.array([0, 1]), "b": b}, batch)


class SlowEnv(WrongShapeEnv):
    """Its second step takes 1.5 s."""

    def __init__(self):
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 2:
            time.sleep(1.5)
        return np.zeros(3, np.float32), 0.0, False, False, {}


def test_a_stalled_worker_is_named_once_when_no_timeout_is_set(monkeypatch):
    """Without a timeout a hung env step waited forever without a word."""
    from peregrine.vector import processes
    monkeypatch.setattr(processes, "STALL_SECONDS", 0.5)
    with pv.make(SlowEnv, backend="multiprocessing", num_envs=1) as env:
        actions = np.zeros(1, env.single_action_space.dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.step(actions)
            env.step(actions)       # 1.5 s: one warning, and the step still completes
        stalls = [w for w in caught if issubclass(w.category, processes.StallWarning)]
        assert len(stalls) == 1
        assert re.match(r"vector env worker\(s\) \[0\] have not answered for [01] s: an env "
                        r"whose step or reset never returns\?", str(stalls[0].message))


def test_hanging_worker_is_stopped_after_the_timeout():
    env = pv.make(HangingEnv, backend="multiprocessing", num_envs=1, timeout=1.0)
    pids, segment = env.worker_pids, env._resources.shm.name.lstrip("/")
    actions = np.zeros(1, env.single_action_space.dtype)  # Gymnasium's Discrete: int64
    env.step(actions)
    env.step(actions)
    with pytest.raises(pv.WorkerTimeoutError, match=r"worker\(s\) \[0\].*did not answer "
                                                    r"within timeout=1 s"):
        env.step(actions)
    assert not any(pid_alive(pid) for pid in pids)
    assert segment not in shm_segments()
    with pytest.raises(RuntimeError, match="closed"):
        env.step(actions)


@pytest.mark.parametrize("backend, timeout, message", [
    ("serial", 1.0, "timeout applies to backend 'multiprocessing' only"),
    ("multiprocessing", 0, "timeout must be a positive number"),
    ("multiprocessing", -1.0, "timeout must be a positive number"),
    ("multiprocessing", "1", "timeout must be a positive number")])
def test_bad_timeouts_are_refused(backend, timeout, message):
    with pytest.raises(ValueError, match=message):
        pv.make("cartpole", backend=backend, num_envs=2, timeout=timeout)


# ---- config through the CLI ------------------------------------------------------------

@pytest.mark.parametrize("override, code, message", [
    (["--vec.num-envs", "1e12"], 2, r"num_envs must be an int in \[1, 67108864\]"),
    (["--env.gravity", "-5"], 2, r"config field 'gravity' = -5.0 must be in \[0, 10000\]"),
    (["--env.max-steps", "2.5"], 2, "env.max_steps must be an integer"),
    (["--train.seed", "1e30"], 2, "train.seed must be less than 2\\*\\*64"),
    (["--train.torch-threads", "100000"], 2, "train.torch_threads must be in"),
    (["--train.horizon", "1e12"], 1, "the rollout storage .* more than this machine's"),
    (["--policy.hidden-size", "1000000"], 1, "the policy .* more than this machine's"),
])
def test_cli_config_values_that_cannot_work_are_one_clear_line(tmp_path, capsys, override,
                                                               code, message):
    argv = ["train", "cartpole", "--detach", "--run-dir", str(tmp_path / "run"), *override]
    assert cli_main(argv) == code
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err, err


class NanRewardEnv(WrongShapeEnv):
    def step(self, action):
        return np.zeros(3, np.float32), float("nan"), False, False, {}


class RaisingEnv(WrongShapeEnv):
    def step(self, action):
        raise RuntimeError("my env broke")


@pytest.mark.parametrize("factory, expected", [
    # a check's refusal: the one line says it all
    ("NanRewardEnv", []),
    # the env's own exception: its traceback (its file and line) above the line
    ("RaisingEnv", ["test_adversarial.py", 'raise RuntimeError("my env broke")']),
])
def test_an_env_failing_in_a_worker_is_a_short_cli_error(tmp_path, capsys, factory, expected):
    """It was the parent's 40-70-line traceback through the trainer and the vector env
    (every worker's traceback inside), exit 1."""
    argv = ["train", f"test_adversarial:{factory}", "--detach", "--run-dir",
            str(tmp_path / "run"), "--total-steps", "256", "--vec.num-envs", "2",
            "--vec.backend", "multiprocessing", "--train.minibatch-size", "64"]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert re.match(r"peregrine train: error: in vector env worker [01]: ", last) and \
        ("finite number: nan" in last or "RuntimeError: my env broke" in last), err
    for text in expected:
        assert text in err, err
    assert "ppo.py" not in err and err.count("Traceback") == bool(expected), err  # one worker's


# ---- checkpoints and the run directory -------------------------------------------------

def test_resume_with_another_policy_config_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "cartpole", "--detach", "--run-dir", str(run), "--total-steps", "256",
            "--vec.num-envs", "8"]
    assert cli_main(argv) == 0
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run), "--policy.hidden-size", "32"]) == 2
    err = capsys.readouterr().err
    assert "cannot change policy.hidden_size (64 in the checkpoint, 32 now)" in err, err
    assert "Traceback" not in err
    # A finished run resumed without more steps: refused (it printed "finished" again and
    # appended another status line to metrics.jsonl each time).
    lines = (run / "metrics.jsonl").read_text()
    assert cli_main(["train", "--resume", str(run), "--detach"]) == 2
    assert "has trained 256 steps and train.total_steps is 256: nothing is left to train" \
        in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == lines


def test_resume_with_another_envs_checkpoint_is_refused(tmp_path, capsys):
    for name in ("cartpole", "pendulum"):
        assert cli_main(["train", name, "--detach", "--run-dir", str(tmp_path / name),
                         "--total-steps", "256", "--vec.num-envs", "8"]) == 0
    ours = tmp_path / "cartpole" / "checkpoints" / "latest.pt"
    ours.write_bytes((tmp_path / "pendulum" / "checkpoints" / "latest.pt").read_bytes())
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(tmp_path / "cartpole")]) == 2
    err = capsys.readouterr().err
    assert "trained on 'pendulum'" in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["under_a_file", "is_a_file"])
def test_unusable_run_directory_is_one_clear_line(tmp_path, capsys, where):
    """Running as root ignores permissions, so an unwritable run directory is made
    by a path through (or at) a regular file."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    run_dir = blocker / "run" if where == "under_a_file" else blocker
    code = cli_main(["train", "cartpole", "--detach", "--run-dir", str(run_dir),
                     "--total-steps", "256", "--vec.num-envs", "8"])
    err = capsys.readouterr().err
    if where == "is_a_file":    # refused before anything is made (a usage error)
        assert code == 2 and "is a file, not a directory" in err
    else:
        assert code == 1 and "Not a directory" in err
    assert "Traceback" not in err
    assert blocker.read_text() == "x"


def test_full_disk_fails_the_run_with_the_file_named_and_no_debris(tmp_path, capsys):
    """A file-size limit (RLIMIT_FSIZE) makes every write past 20 kB fail as a full
    disk does: the dashboard is disabled with a warning, the checkpoint write fails
    with its path named, no temporary file is left, and the log says crashed."""
    run = tmp_path / "run"
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    try:
        code = cli_main(["train", "cartpole", "--detach", "--run-dir", str(run),
                         "--total-steps", "512", "--vec.num-envs", "8",
                         "--train.checkpoint-interval", "1"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert "cannot write checkpoint" in err and "latest.pt" in err and "too large" in err
    assert "dashboard metrics disabled" in err
    assert os.listdir(run / "checkpoints") == []
    assert (run / "metrics.jsonl").read_text().splitlines()[-1] == '{"status": "crashed"}'


# ---- the monitor -----------------------------------------------------------------------

def test_monitor_on_a_directory_where_the_metrics_file_should_be(tmp_path, capsys):
    (tmp_path / "metrics.bin").mkdir()
    assert cli_main(["monitor", str(tmp_path), "--once"]) == 1
    err = capsys.readouterr().err
    assert "metrics.bin" in err and "Traceback" not in err


def test_monitor_given_some_other_file_says_so(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("not metrics")
    assert cli_main(["monitor", str(other), "--once"]) == 1
    err = capsys.readouterr().err
    assert "is a file, not a run directory or its metrics.bin" in err and "Traceback" not in err


# ---- issue 25: values an emulated env must not get away with ----------------------------------

class _Strict(gymnasium.Env):
    """A Box(4) env; the instance reset with a nonzero seed (env 1 of a vector env
    seeded 0) returns `bad` for the field named by `what` from its first step."""
    observation_space = spaces.Box(-5, 5, (4,), np.float32)
    action_space = spaces.Discrete(2)
    what, bad = "observation", None

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.broken = seed != 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        result = [np.zeros(4, np.float32), 1.0, False, False, {}]
        if getattr(self, "broken", False):
            result[("observation", "reward", "terminated", "truncated").index(self.what)] = self.bad
        return tuple(result)


def _strict(what, bad):
    return type(f"Strict_{what}", (_Strict,), {"what": what, "bad": bad})


STRICT_CASES = [
    ("observation", np.float32(1.0), r"env 1 returned an observation of shape \(\) that does not "
                                     r"fit its observation_space"),
    ("observation", np.ones(1, np.float32), r"env 1 returned an observation of shape \(1,\)"),
    ("observation", np.ones((4, 1), np.float32), r"env 1 returned an observation of shape \(4, 1\)"),
    ("reward", float("nan"), "env 1 returned a reward that is not a finite number: nan"),
    ("reward", np.float32("inf"), "env 1 returned a reward that is not a finite number: inf"),
    ("reward", "3", "env 1 returned a reward that is not a number: '3'"),
    ("reward", None, "env 1 returned a reward that is not a number: None"),
    ("terminated", "no", "env 1 returned terminated = 'no', which is not a bool"),
    ("truncated", 1, "env 1 returned truncated = 1, which is not a bool"),
]


@pytest.mark.parametrize("what, bad, message", STRICT_CASES,
                         ids=[f"{w}-{b!r}" for w, b, _ in STRICT_CASES])
def test_emulated_values_are_checked_alike_on_serial_and_multiprocessing(what, bad, message):
    """No broadcasting of a scalar or size-1 observation into a Box(4), no NaN/inf or
    non-numeric reward, no flag that is not a bool: the same message, naming the env,
    on both backends; the well-behaved env 0 never trips it."""
    env_class = _strict(what, bad)
    actions = np.zeros(2, np.int64)
    with pv.make(env_class, backend="serial", num_envs=2, num_workers=2, seed=0) as env:
        with pytest.raises(ValueError, match=message):
            env.step(actions)
    with pv.make(env_class, backend="multiprocessing", num_envs=2, num_workers=1,
                 seed=0) as env:
        with pytest.raises(pv.WorkerError, match=f"(?s)worker 0.*{message}"):
            env.step(actions)


def test_numpy_scalars_and_bools_are_still_accepted():
    class Fine(_Strict):
        def step(self, action):
            return (np.ones(4, np.float64).tolist(), np.float64(0.5), np.bool_(False),
                    False, {})
    with pv.make(Fine, backend="serial", num_envs=2, seed=0) as env:
        _, rewards, *_ = env.step(np.zeros(2, np.int64))
        assert rewards.tolist() == [0.5, 0.5]
        assert env.observations.tolist() == [[1.0] * 4] * 2


def test_pettingzoo_rewards_and_flags_are_checked_per_agent():
    from test_vector_helpers import Squad

    class BadSquad(Squad):
        def step(self, actions):
            observations, rewards, terminations, truncations, infos = super().step(actions)
            rewards["a1"] = float("nan")
            return observations, rewards, terminations, truncations, infos

    with pv.make(BadSquad, backend="serial", num_envs=1) as env:
        with pytest.raises(ValueError, match="env 0 returned a reward for agent 'a1' that is "
                                             "not a finite number: nan"):
            env.step(np.zeros(3, np.int64))


class OldGymEnv(WrongShapeEnv):
    """The old Gym API: step returns (obs, reward, done, info); reset(seed=1) returns
    the observation alone."""

    def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32) if seed == 1 else (np.zeros(3, np.float32), {})

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, {}


def test_the_old_gym_api_is_named():
    """It unpacked as "not enough values to unpack (expected 5, got 4)"."""
    with pv.make(OldGymEnv, backend="serial", num_envs=1) as env:
        with pytest.raises(ValueError, match=r"env 0's step\(\) returned a tuple of 4, not "
                                             r"\(observation, reward, terminated, truncated, "
                                             r"info\) \(the old Gym API's"):
            env.step(np.zeros(1, np.int64))
        with pytest.raises(ValueError, match=r"reset\(\) returned ndarray, not \(observation, "
                                             r"info\) \(the old Gym API's reset returned the "
                                             r"observation alone\)"):
            env.reset(seed=1)


def _squad_step_changed(change):
    from test_vector_helpers import Squad

    class Changed(Squad):
        def step(self, actions):
            return change(*super().step(actions))
    return Changed


@pytest.mark.parametrize("change, message", [
    # a missing reward counted as 0 and a missing flag as False, without a word
    (lambda o, r, te, tr, i: (o, {k: v for k, v in r.items() if k != "a2"}, te, tr, i),
     r"env 0's step gave no reward for agent\(s\) \['a2'\], which acted in it"),
    (lambda o, r, te, tr, i: (o, r, {k: v for k, v in te.items() if k != "a0"}, tr, i),
     r"gave no terminated for agent\(s\) \['a0'\]"),
    (lambda o, r, te, tr, i: ({k: v for k, v in o.items() if k != "a1"}, r, te, tr, i),
     r"gave no observation for agent\(s\) \['a1'\]"),
    (lambda o, r, te, tr, i: (o, list(r.values()), te, tr, i),
     r"step returned rewards as list, not a dict keyed by agent"),
    # an agent outside possible_agents was a bare KeyError
    (lambda o, r, te, tr, i: ({**o, "a9": o["a0"]}, r, te, tr, i),
     r"env 0 returned an observation for agent\(s\) \['a9'\], which are not in its "
     r"possible_agents \['a0', 'a1', 'a2'\]"),
])
def test_pettingzoo_steps_must_cover_the_agents_that_acted(change, message):
    with pv.make(_squad_step_changed(change), backend="serial", num_envs=1) as env:
        with pytest.raises(ValueError, match=message):
            env.step(np.zeros(3, np.int64))


# ---- issue 25: processes that outlive their parent --------------------------------------------

_STUCK_PARENT = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{src!r}, {tests!r}]
    import numpy as np
    import peregrine.vector as pv
    from test_adversarial import HangingEnv

    if __name__ == "__main__":
        env = pv.make(HangingEnv, backend="multiprocessing", num_envs=2, num_workers=2)
        names = [env._resources.shm.name] + [w.wake._semlock.name for w in env._workers]
        print(" ".join(map(str, env.worker_pids)), " ".join(n.lstrip("/") for n in names),
              flush=True)
        actions = np.zeros(2, env.single_action_space.dtype)
        while True:
            env.step(actions)      # the third step never returns
""")


def _dev_shm(name):
    return os.path.exists(f"/dev/shm/{name}") or os.path.exists(f"/dev/shm/sem.{name}")


def test_workers_stuck_in_step_die_with_a_killed_parent_and_leave_nothing(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "stuck.py"
    tests = os.path.dirname(os.path.abspath(__file__))
    script.write_text(_STUCK_PARENT.format(src=os.path.join(tests, "..", "src"), tests=tests))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    words = parent.stdout.readline().split()
    assert words, parent.stderr.read()
    pids, names = [int(w) for w in words[:2]], words[2:]
    try:
        assert all(_dev_shm(name) for name in names[1:])    # the semaphores' names
        time.sleep(1.0)                 # both workers are now stuck inside step
        parent.kill()
        parent.wait(timeout=10)
        poll_until(lambda: not any(pid_alive(p) for p in pids) and not any(map(_dev_shm, names)),
                   10)
        assert [p for p in pids if pid_alive(p)] == []
        assert [n for n in names if _dev_shm(n)] == []
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---- issue 25: fork after a threaded native env ------------------------------------------------

_FORKS = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [{src!r}]
    import numpy as np
    import peregrine

    env = peregrine.make("cartpole", num_envs=256, seed=0, num_threads=2)
    actions = np.ones(256, np.int32)
    hung = 0
    for attempt in range(10):
        env.step(actions)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                    # the child steps, then closes or just exits
            os.close(read)
            env.step(actions)
            os.write(write, env.observations.tobytes())
            if attempt % 2:
                env.close()
            sys.exit(0)                 # interpreter exit frees whatever is left
        os.close(write)
        env.step(actions)
        got = b""
        while len(got) < env.observations.nbytes:
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            got += chunk
        os.close(read)
        assert got == env.observations.tobytes(), "the child stepped differently"
        deadline = time.monotonic() + 5
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0, status
                break
            if time.monotonic() > deadline:
                hung += 1
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    env.close()
    print("hung", hung)
""")


def test_a_forked_child_of_a_threaded_native_env_steps_closes_and_exits():
    """The thread pool does not survive fork(): the child gets a pool of its own on
    first use, steps exactly as the parent, and neither close() nor interpreter exit
    hangs on the parent's threads (10 forks, each given 5 s)."""
    import subprocess
    import sys
    tests = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run([sys.executable, "-c",
                             _FORKS.format(src=os.path.join(tests, "..", "src"))],
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hung", "0"], result.stdout


# ---- issue 25: the metrics file cannot kill training or the monitor -------------------------

_TRUNCATE = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [{src!r}]
    from peregrine.monitor.metrics import MetricsReader, MetricsWriter, MetricsFileError
    run = sys.argv[1]
    writer = MetricsWriter(run, ["x"])
    writer.update(global_step=1, updates=1, env_stats={{"x": 1.0}})
    reader = MetricsReader(run)
    path = os.path.join(run, "metrics.bin")
    if sys.argv[2] == "truncate":
        os.truncate(path, 0)
    elif sys.argv[2] == "overwrite":        # as `cp other metrics.bin` does: same inode
        with open(path, "wb") as handle:
            handle.write(b"something else entirely")
    else:
        os.replace(path, path + ".old")
        with open(path, "wb") as handle:
            handle.write(b"something else entirely")
    try:
        reader.read()
        print("reader: no error")
    except MetricsFileError as error:
        print("reader:", error)
    writer.update(global_step=2, updates=2, env_stats={{"x": 2.0}})
    writer.update(global_step=3, updates=3, env_stats={{"x": 3.0}})
    writer.close("finished")
    print("writer: carried on")
""")


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "rename"])
def test_a_truncated_or_replaced_metrics_file_kills_neither_writer_nor_reader(tmp_path, damage):
    """Truncating metrics.bin under a memory map used to be SIGBUS (exit -7) in the
    trainer and in an attached monitor. Now a reader of a cut file raises
    MetricsFileError, the writer warns once and carries on, and rewrites a file cut
    or overwritten in place; a file renamed over it is left alone (the reader keeps
    the run's own file)."""
    import subprocess
    import sys
    from peregrine.monitor.metrics import MetricsReader
    tests = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run([sys.executable, "-c",
                             _TRUNCATE.format(src=os.path.join(tests, "..", "src")),
                             str(tmp_path), damage], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (result.returncode, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[-1] == "writer: carried on"
    assert result.stderr.count("warning: ") == 1, result.stderr
    if damage == "rename":
        assert lines[0] == "reader: no error"
        assert "metrics.bin was replaced by another file" in result.stderr
        assert (tmp_path / "metrics.bin").read_bytes() == b"something else entirely"
        return
    assert lines[0].startswith("reader: ") and "metrics.bin is truncated" in lines[0], lines
    assert "metrics.bin was truncated or overwritten" in result.stderr, result.stderr
    with MetricsReader(tmp_path) as reader:     # whole again, with the latest record
        latest = reader.read()
        assert latest["updates"] == 3 and latest.status == "finished"
        assert latest.env_stats == {"x": 3.0}


# ---- issue 25, finding 11: wording and copies ---------------------------------------------------

def _tiny_run(tmp_path):
    run = tmp_path / "run"
    assert cli_main(["train", "cartpole", "--detach", "--run-dir", str(run), "--total-steps",
                     "256", "--vec.num-envs", "8", "--train.tensorboard", "false"]) == 0
    return run / "checkpoints" / "latest.pt"


def test_a_checkpoint_with_extra_bytes_is_not_called_truncated(tmp_path):
    from peregrine.train import checkpoint
    path = _tiny_run(tmp_path)
    path.write_bytes(path.read_bytes() + b"junk")
    with pytest.raises(ValueError, match="4 bytes more than its header promises") as caught:
        checkpoint.load(path)
    assert "truncated" not in str(caught.value)


class _NotAllowed:
    pass


def test_a_checkpoint_holding_code_is_refused_without_torchs_unsafe_hint(tmp_path):
    import hashlib
    import io

    import torch

    from peregrine.train import checkpoint
    buffer = io.BytesIO()
    torch.save({"format_version": checkpoint.FORMAT_VERSION, "x": _NotAllowed()}, buffer)
    data = buffer.getvalue()
    path = tmp_path / "evil.pt"
    path.write_bytes(checkpoint.HEADER.pack(checkpoint.MAGIC, len(data),
                                            hashlib.sha256(data).digest()) + data)
    with pytest.raises(ValueError) as caught:
        checkpoint.load(path)
    message = str(caught.value)
    assert "_NotAllowed" in message and "not a Peregrine training checkpoint" in message
    assert "weights_only" not in message and "will likely succeed" not in message


def test_a_shallow_copy_never_shares_or_closes_the_c_batch():
    import copy
    with peregrine.make("cartpole", num_envs=4, seed=0) as env:
        try:
            duplicate = copy.copy(env)
        except TypeError as error:      # refusing is fine, if it says what to do instead
            assert "peregrine.make" in str(error)
        else:
            assert duplicate._batch is not env._batch
            duplicate.close()
        env.step(np.zeros(4, np.int32))     # the original still works
