"""Multiprocessing failure modes: nothing hangs, nothing leaks."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import peregrine.vector as pv

from polling import wait_gone
from test_vector_helpers import (FlakyEnv, fails_in_worker, gym_cartpole, pid_alive,
                                 record_segments, shm_segments, slow_cartpole)

pytestmark = pytest.mark.timeout(60)  # a hang fails the test instead of the suite
TESTS_DIR = os.path.dirname(__file__)
SRC_DIR = os.path.join(TESTS_DIR, "..", "src")


def _segment_name(env):
    return env._resources.shm.name.lstrip("/")


def test_close_frees_processes_and_shared_memory(monkeypatch):
    ours = record_segments(monkeypatch)
    env = pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2, seed=0,
                  overwork=True)
    pids, name = env.worker_pids, _segment_name(env)
    # the name is gone as soon as every worker has mapped the segment
    assert name not in shm_segments() and all(pid_alive(p) for p in pids)
    observations, _ = env.reset()
    env.step(np.zeros(4, np.int32))
    env.close()
    env.close()  # idempotent
    assert wait_gone(pids, 1.0) == []
    assert ours and not ours & shm_segments()
    with pytest.raises(RuntimeError, match="closed"):
        env.step(np.zeros(4, np.int32))
    assert observations.shape == (4, 4)  # arrays the caller kept stay readable


def test_garbage_collection_frees_everything(monkeypatch):
    ours = record_segments(monkeypatch)
    env = pv.make(gym_cartpole, backend="multiprocessing", num_envs=2, num_workers=2, seed=0,
                  overwork=True)
    pids = env.worker_pids
    env.reset()
    del env
    gc.collect()
    assert wait_gone(pids, 5.0) == []
    assert ours and not ours & shm_segments()


def test_killed_worker_is_reported_quickly_and_cleaned_up():
    env = pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2, seed=0,
                  overwork=True)
    pids, name = env.worker_pids, _segment_name(env)
    env.step(np.zeros(4, np.int32))
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(pv.WorkerDiedError, match="worker 1 .* killed by signal SIGKILL"):
        for _ in range(100_000):
            env.step(np.zeros(4, np.int32))
    assert time.monotonic() - start < 30  # generous: the real bound is ~50 ms of polling
    assert wait_gone(pids, 2.0) == []  # the surviving worker was stopped too
    assert name not in shm_segments()   # (by name: other jobs on the machine make their own)
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_killed_worker_while_waiting_for_a_batch():
    env = pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2,
                  batch_size=2, seed=0, overwork=True)
    with env:
        env.async_reset()
        env.recv()
        env.send(np.zeros(2, np.int32))
        env.recv()
        for pid in env.worker_pids:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(pv.WorkerDiedError, match="SIGKILL"):
            env.send(np.zeros(2, np.int32))
            env.recv()
            env.send(np.zeros(2, np.int32))
            env.recv()


def test_exception_in_worker_reaches_parent_with_traceback(monkeypatch):
    ours = record_segments(monkeypatch)
    with pv.make(lambda: FlakyEnv(fail_at=3), backend="multiprocessing", num_envs=4,
                 num_workers=2, seed=0, overwork=True) as env:
        env.step(np.zeros(4, np.int64))
        env.step(np.zeros(4, np.int64))
        with pytest.raises(pv.WorkerError) as caught:
            env.step(np.zeros(4, np.int64))
        text = str(caught.value)
        assert "flaky env exploded" in text and "Traceback" in text
        assert "in step" in text and "test_vector_helpers.py" in text  # the worker's own frames
        assert "worker 0" in text and "worker 1" in text
        # the workers survive an exception and keep serving requests
        env.reset(seed=1)
        assert env.episode_stats().count == 0
    assert ours and not ours & shm_segments()


def test_exception_from_a_message_names_its_worker():
    with pv.make("cartpole", backend="multiprocessing", num_envs=2, num_workers=2,
                 overwork=True) as env:
        with pytest.raises(pv.WorkerError, match="(?s)worker 1.*RuntimeError: deliberate"):
            env._raise_in_worker(1, "deliberate")
        env.step(np.zeros(2, np.int32))  # still usable


def test_exception_while_creating_envs_in_worker(monkeypatch):
    ours = record_segments(monkeypatch)
    with pytest.raises(pv.WorkerError, match="(?s)fails_in_worker.*no display in the worker"):
        pv.make(fails_in_worker, backend="multiprocessing", num_envs=2, num_workers=2,
                overwork=True)
    gc.collect()
    assert ours and not ours & shm_segments()


def _interrupt_after(seconds):
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, raise_interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return previous


def test_caught_ctrl_c_mid_step_leaves_the_env_usable():
    """A trainer catching Ctrl-C (to save a checkpoint) can still talk to the
    workers: the interrupted step is waited for before the next command."""
    with pv.make(slow_cartpole, backend="multiprocessing", num_envs=2, num_workers=2,
                 seed=0, overwork=True) as env:
        env.reset(seed=0)
        previous = _interrupt_after(0.05)
        try:
            with pytest.raises(KeyboardInterrupt):
                env.step(np.zeros(2, np.int64))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert env.episode_stats().count == 0  # waits for the step, then asks
        previous = _interrupt_after(0.05)
        try:
            with pytest.raises(KeyboardInterrupt):
                env.reset(seed=1)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        observations, rewards, *_ = env.step(np.ones(2, np.int64))  # replies stay in step
        assert rewards.tolist() == [1.0, 1.0]
        assert env.episode_stats().count == 0


_LOOP = textwrap.dedent("""
    import sys
    sys.path[:0] = [{src!r}, {tests!r}]
    import numpy as np
    import peregrine.vector as pv
    from test_vector_helpers import gym_cartpole

    if __name__ == "__main__":
        env = pv.make({env}, backend="multiprocessing", num_envs=4, num_workers=2, seed=0)
        print(" ".join(map(str, env.worker_pids)), env._resources.shm.name.lstrip("/"),
              flush=True)
        actions = np.zeros(4, env.single_action_space.dtype)
        while True:
            env.step(actions)
""")


def _start_loop(tmp_path, env_expr):
    script = tmp_path / "loop.py"
    script.write_text(_LOOP.format(src=SRC_DIR, tests=TESTS_DIR, env=env_expr))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline().split()
    assert line, process.stderr.read()
    pids, name = [int(p) for p in line[:-1]], line[-1]
    time.sleep(0.3)  # let it step a while
    return process, pids, name


@pytest.mark.parametrize("env_expr", ["'cartpole'", "gym_cartpole"])
def test_ctrl_c_in_parent_frees_workers_and_shared_memory(tmp_path, env_expr):
    process, pids, name = _start_loop(tmp_path, env_expr)
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=30)
    assert "KeyboardInterrupt" in err
    assert wait_gone(pids, 5.0) == []
    assert name not in shm_segments()


def test_parent_killed_outright_workers_exit_on_their_own(tmp_path):
    process, pids, name = _start_loop(tmp_path, "'cartpole'")
    process.kill()
    process.wait(timeout=10)
    assert wait_gone(pids, 10.0) == []
    assert name not in shm_segments()     # unlinked once the workers had mapped it
