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
import resource
import signal
import threading
import time

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import peregrine
import peregrine.vector as pv
from peregrine.cli import main as cli_main
from peregrine.envs.native import batch as native_env
from test_vector_helpers import pid_alive, shm_segments

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
def test_vector_backends_refuse_negative_or_non_integer_counts(backend, name, value):
    before = shm_segments()
    with pytest.raises(ValueError, match=f"{name} must be an int >= 1, got {value!r}"):
        pv.make("cartpole", backend=backend, **{"num_envs": 4, name: value})
    assert shm_segments() == before


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
    import re
    argv = ["train", "cartpole", "--detach", "--run-dir", str(tmp_path / "run"), *override]
    assert cli_main(argv) == code
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err, err


# ---- checkpoints and the run directory -------------------------------------------------

def test_resume_with_another_policy_config_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "cartpole", "--detach", "--run-dir", str(run), "--total-steps", "256",
            "--vec.num-envs", "8"]
    assert cli_main(argv) == 0
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run), "--policy.hidden-size", "32"]) == 2
    err = capsys.readouterr().err
    assert "does not fit this run's [policy] config" in err and "Traceback" not in err


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
    assert cli_main(["train", "cartpole", "--detach", "--run-dir", str(run_dir),
                     "--total-steps", "256", "--vec.num-envs", "8"]) == 1
    err = capsys.readouterr().err
    assert ("Not a directory" in err or "File exists" in err) and "Traceback" not in err
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
