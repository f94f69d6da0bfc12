"""Runs that cannot be corrupted (issue 25): one owner per run directory, no orphan
ranks, SIGTERM as a preemption, elastic restarts, ranks that agree before they train,
and resumes that refuse to change what the checkpoint means.

Kept cheap: CartPole with 8 envs, a few hundred steps, subprocesses only where a
signal or a second process is the point of the test."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from peregrine.cli import main as cli_main
from peregrine.train import checkpoint

from polling import poll_until, wait_gone
from test_vector_helpers import child_pids, pid_alive

pytestmark = pytest.mark.timeout(240)  # a hang fails the test instead of the suite

SRC_DIR = str(Path(__file__).resolve().parent.parent / "src")
TINY = ["--detach", "--vec.num-envs", "8", "--train.tensorboard", "false",
        "--train.stop-return", "0"]     # a solved CartPole would end the run early
ENDLESS = ["--total-steps", "1e9", "--train.checkpoint-interval", "0"]
WAIT = 120      # seconds: a guard against a hung job, not a speed requirement


def _environ():
    environ = dict(os.environ)
    environ["PYTHONPATH"] = SRC_DIR + os.pathsep + environ.get("PYTHONPATH", "")
    return environ


def start(args, **kwargs):
    """`peregrine ARGS` in a subprocess of its own session."""
    return subprocess.Popen([sys.executable, "-m", "peregrine", *args], env=_environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)


def records(run_dir):
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def updates_of(run_dir):
    return [r["updates"] for r in records(run_dir) if "updates" in r]


def wait_for_updates(run_dir, count, process):
    def going():
        if process.poll() is not None:
            raise AssertionError(process.communicate())
        return len(updates_of(run_dir)) >= count

    assert poll_until(going, WAIT), "the run never got going"


def stop(process):
    """Ends a test's subprocess and everything in its session, whatever state it is in."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return process.communicate(timeout=WAIT)


def descendants(pid):
    found, frontier = [], [pid]
    while frontier:
        children = child_pids(frontier.pop())
        found += children
        frontier += children
    return found


# ---- finding 1: one owner per run directory -----------------------------------------------

def test_a_second_run_into_a_live_run_directory_is_refused_naming_the_holder(tmp_path, capsys):
    run = tmp_path / "run"
    first = start(["train", "cartpole", *TINY, *ENDLESS, "--run-dir", str(run), "--seed", "1"])
    try:
        wait_for_updates(run, 2, first)
        for extra in ([], ["--resume", str(run)], ["--overwrite"]):
            argv = (["train", "--resume", str(run)] if extra[:1] == ["--resume"] else
                    ["train", "cartpole", *TINY, "--run-dir", str(run), "--seed", "2", *extra])
            assert cli_main(argv) == 2
            err = capsys.readouterr().err
            assert f"is in use by process {first.pid} on {socket.gethostname()}" in err, err
            assert "Traceback" not in err
        assert first.poll() is None     # the owner never noticed
    finally:
        stop(first)
    assert all(r.get("world_size", 1) == 1 for r in records(run))
    seen = updates_of(run)
    assert seen == list(range(1, len(seen) + 1))    # one run's records, each once
    assert "seed = 1" in (run / "config.toml").read_text()


# ---- finding 2: a run directory is not silently reused ---------------------------------------

def test_a_new_run_into_a_finished_run_directory_is_refused_or_moved_aside(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main(["train", "cartpole", *TINY, "--run-dir", str(run), "--total-steps", "512"]) == 0
    before = {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert "run.lock" in before     # who owned it last (pid, host, time)
    capsys.readouterr()
    assert cli_main(["train", "pendulum", *TINY, "--run-dir", str(run),
                     "--total-steps", "512"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err, err
    assert {p.name: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # --overwrite moves the old run aside, whole, and starts clean
    assert cli_main(["train", "pendulum", *TINY, "--run-dir", str(run), "--total-steps", "512",
                     "--overwrite"]) == 0
    err = capsys.readouterr().err
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1 and str(aside[0]) in err
    assert {p.name: p.read_bytes() for p in aside[0].rglob("*") if p.is_file()} == before
    state = checkpoint.load(run)
    assert state["env_name"] == "pendulum"
    assert updates_of(run) == list(range(1, state["updates"] + 1))


def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli_main(["train", "cartpole", *TINY, "--run-dir", str(tmp_path),
                     "--total-steps", "256"]) == 2
    err = capsys.readouterr().err
    assert "is not empty and holds no Peregrine run" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    # a file where the directory would go: one line, also with --overwrite (was a bare
    # FileExistsError from Python)
    for extra in ([], ["--overwrite"]):
        assert cli_main(["train", "cartpole", *TINY, "--run-dir", str(tmp_path / "notes.txt"),
                         "--total-steps", "256", *extra]) == 2
        assert "is a file, not a directory" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_retry_after_a_crash_before_the_first_checkpoint_starts_clean(tmp_path, capsys):
    run = tmp_path / "run"
    command = ["train", "cartpole", *TINY, "--run-dir", str(run), "--seed", "3"]
    crashed = start([*command, *ENDLESS])
    try:
        wait_for_updates(run, 3, crashed)
    finally:
        stop(crashed)      # kill -9: no checkpoint was ever written
    assert not (run / "checkpoints" / "latest.pt").exists() and updates_of(run)
    capsys.readouterr()
    assert cli_main([*command, "--total-steps", "768"]) == 0
    assert "never reached a checkpoint" in capsys.readouterr().err
    lines = records(run)
    assert [r["updates"] for r in lines[:-1]] == [1, 2, 3] and lines[-1] == {"status": "finished"}


# ---- finding 10: resume keeps what the checkpoint means ----------------------------------------

@pytest.mark.parametrize("override, field", [
    (["--policy.activation", "relu"], "policy.activation"),
    (["--seed", "5"], "train.seed"),
    (["--env.gravity", "5"], "env.gravity"),
    (["--train.horizon", "16"], "train.horizon")])
def test_resume_refuses_changes_to_what_the_weights_or_schedule_mean(tmp_path, capsys,
                                                                     override, field):
    run = tmp_path / "run"
    assert cli_main(["train", "cartpole", *TINY, "--run-dir", str(run),
                     "--total-steps", "256"]) == 0
    saved = (run / "checkpoints" / "latest.pt").read_bytes()
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run), *override]) == 2
    err = capsys.readouterr().err
    assert f"cannot change {field}" in err and "Traceback" not in err, err
    assert (run / "checkpoints" / "latest.pt").read_bytes() == saved


def test_resume_accepts_a_new_step_budget(tmp_path):
    run = tmp_path / "run"
    assert cli_main(["train", "cartpole", *TINY, "--run-dir", str(run),
                     "--total-steps", "256"]) == 0
    assert cli_main(["train", "--resume", str(run), "--total-steps", "768",
                     "--train.learning-rate", "1e-3", "--train.checkpoint-interval", "1"]) == 0
    assert checkpoint.load(run)["updates"] == 3
    assert updates_of(run) == [1, 2, 3]


# ---- finding 6: SIGTERM is a preemption ---------------------------------------------------------

def test_sigterm_saves_a_checkpoint_and_exits_with_the_documented_code(tmp_path):
    run = tmp_path / "run"
    job = start(["train", "cartpole", *TINY, *ENDLESS, "--run-dir", str(run)])
    try:
        wait_for_updates(run, 3, job)
        job.send_signal(signal.SIGTERM)
        job.send_signal(signal.SIGTERM)    # a scheduler may send it twice: still graceful
        out, err = job.communicate(timeout=WAIT)
    finally:
        stop(job)
    assert job.returncode == 143, err
    assert "interrupted (SIGTERM)" in out, out
    assert err.count("SIGTERM: stopping after this update, then saving\n") == 1, err
    lines = records(run)
    assert lines[-1] == {"status": "interrupted"}
    assert checkpoint.load(run)["updates"] == lines[-2]["updates"]


def test_sigterm_to_the_launcher_reaches_every_rank_and_saves_once(tmp_path):
    run = tmp_path / "run"
    job = start(["train", "cartpole", *TINY, *ENDLESS, "--run-dir", str(run), "--nproc", "2",
                 "--vec.num-envs", "4", "--train.minibatch-size", "64"])
    try:
        wait_for_updates(run, 3, job)
        ranks = descendants(job.pid)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=WAIT)
    finally:
        stop(job)
    assert job.returncode == 143, err
    assert err.count("SIGTERM: stopping after this update") == 1, err   # rank 0's, once
    assert wait_gone(ranks, 10) == []
    lines = records(run)
    assert lines[-1] == {"status": "interrupted"}
    state = checkpoint.load(run)
    assert state["world_size"] == 2 and state["updates"] == lines[-2]["updates"]


# ---- finding 3: ranks die with their launcher ----------------------------------------------------

def test_ranks_die_with_a_killed_launcher_and_the_resume_is_contiguous(tmp_path):
    run = tmp_path / "run"
    job = start(["train", "cartpole", *TINY, "--total-steps", "1e9", "--run-dir", str(run),
                 "--nproc", "2", "--vec.num-envs", "4", "--train.minibatch-size", "64",
                 "--train.checkpoint-interval", "2"])
    ranks = []
    try:
        wait_for_updates(run, 5, job)
        ranks = descendants(job.pid)
        assert len(ranks) >= 2
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=WAIT)      # (not communicate: orphans would hold its pipes open)
        assert wait_gone(ranks, 15) == []
    finally:
        stop(job)
        for pid in ranks:       # orphans: no longer in the launcher's process tree
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    state = checkpoint.load(run)
    saved, per_update = state["updates"], state["global_step"] // state["updates"]
    assert cli_main(["train", "--resume", str(run), "--nproc", "2",
                     "--total-steps", str((saved + 2) * per_update)]) == 0
    seen = updates_of(run)
    assert seen == list(range(1, saved + 3)), seen


# ---- elastic: --max-restarts ---------------------------------------------------------------------

def test_a_killed_rank_restarts_every_rank_from_the_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    total = 14 * 2 * 4 * 32      # 14 updates of 2 ranks x 4 envs x 32 steps
    job = start(["train", "cartpole", *TINY, "--total-steps", str(total), "--run-dir", str(run),
                 "--nproc", "2", "--max-restarts", "1", "--vec.num-envs", "4",
                 "--train.horizon", "32",
                 "--train.minibatch-size", "64", "--train.checkpoint-interval", "3"])
    try:
        wait_for_updates(run, 7, job)
        ranks = descendants(job.pid)
        victim = max(ranks)     # the second rank started
        os.kill(victim, signal.SIGKILL)
        out, err = job.communicate(timeout=WAIT)
    finally:
        stop(job)
    assert job.returncode == 0, err
    lines = records(run)
    assert lines[-1] == {"status": "finished"}
    assert [r["updates"] for r in lines if "updates" in r] == list(range(1, 15))
    assert checkpoint.load(run)["updates"] == 14


# ---- finding 4: ranks agree before they train ------------------------------------------------------

_RANK_SPECIFIC = textwrap.dedent("""
    import os, sys
    from peregrine.cli import main
    extra = os.environ.get("TEST_RANK1_ARGS", "").split() if os.environ["RANK"] == "1" else []
    sys.exit(main(sys.argv[1:] + extra))
""")


def test_ranks_with_different_configs_are_refused_naming_the_keys(tmp_path):
    """Rank 1 gets another hidden size (gloo would abort on the sizes, the
    shared-memory sums trained on), learning rate and env field: every key named,
    before any update."""
    extra = "--policy.hidden-size 32 --train.learning-rate 1e-3 --env.gravity 5"
    keys = "env.gravity, policy.hidden_size, train.learning_rate"
    script = tmp_path / "rank_args.py"
    script.write_text(_RANK_SPECIFIC)
    environ = {**_environ(), "TEST_RANK1_ARGS": extra}
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(script), "train", "cartpole", *TINY,
                          "--run-dir", str(tmp_path / "run"), "--total-steps", "4096",
                          "--vec.num-envs", "4", "--train.minibatch-size", "64"],
                         env=environ, capture_output=True, text=True, timeout=WAIT, cwd=tmp_path)
    assert job.returncode != 0, job.stderr[-3000:]
    assert f"the ranks' configs differ in {keys}" in job.stderr, job.stderr[-3000:]
    assert updates_of(tmp_path / "run") == []


# ---- two hosts over network namespaces -----------------------------------------------------------

def _netns(tag):
    """Two network namespaces joined by a veth pair, 10.251.0.1 and .2 (names unique
    to this test run); (names, cleanup), or pytest.skip naming what the machine
    refused (namespaces need root in a sandbox that allows them)."""
    names = [f"pg25{tag}a", f"pg25{tag}b"]
    links = [f"v25{tag}a", f"v25{tag}b"]
    commands = [["ip", "netns", "add", names[0]], ["ip", "netns", "add", names[1]],
                ["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]]]
    for side in (0, 1):
        commands += [["ip", "link", "set", links[side], "netns", names[side]],
                     ["ip", "-n", names[side], "addr", "add", f"10.251.0.{side + 1}/24",
                      "dev", links[side]],
                     ["ip", "-n", names[side], "link", "set", links[side], "up"],
                     ["ip", "-n", names[side], "link", "set", "lo", "up"]]

    def cleanup():
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    for command in commands:
        try:
            done = subprocess.run(command, capture_output=True, text=True)
        except FileNotFoundError:
            cleanup()
            pytest.skip("no `ip` command (iproute2) to create network namespaces")
        if done.returncode != 0:
            cleanup()
            pytest.skip(f"cannot create network namespaces here: `{' '.join(command)}` "
                        f"failed: {done.stderr.strip()}")
    return names, links, cleanup


def test_two_hosts_over_a_veth_pair_train_as_one_run(tmp_path):
    """Two "hosts" (network namespaces joined by a veth pair: non-loopback addresses,
    each with its own run directory) train CartPole as one job through a c10d
    rendezvous and gloo: rank 0's host alone holds the run, with contiguous records of
    both ranks' steps; the other host's directory stays empty. `is_host`: the
    rendezvous endpoint is no name of this machine, so torchrun is told which node
    serves it. (A rank killed mid-run and restarted is tested on one host above;
    across these namespaces the restart worked alone but closed the rendezvous in a
    loaded full-suite run, so it is not part of this test.)"""
    names, links, cleanup = _netns(str(os.getpid() % 10000))
    homes = [tmp_path / "hostA", tmp_path / "hostB"]
    jobs = []
    try:
        for home in homes:
            home.mkdir()
        port = 29000 + os.getpid() % 1000
        total = 8 * 2 * 4 * 32      # 8 updates of 2 ranks x 4 envs x 32 steps
        for node in (0, 1):
            environ = {**_environ(), "GLOO_SOCKET_IFNAME": links[node]}
            jobs.append(subprocess.Popen(
                ["ip", "netns", "exec", names[node], sys.executable, "-m", "torch.distributed.run",
                 "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"10.251.0.1:{port}", "--rdzv-id", "twohosts",
                 "--rdzv-conf", f"is_host={int(node == 0)}", "--local-addr",
                 f"10.251.0.{node + 1}", "--max-restarts", "0", "-m", "peregrine", "train",
                 "cartpole", *TINY, "--run-dir", "run", "--total-steps", str(total),
                 "--vec.num-envs", "4", "--train.horizon", "32", "--train.minibatch-size", "64"],
                cwd=homes[node], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True))
        results = [job.communicate(timeout=WAIT) for job in jobs]
    finally:
        for job in jobs:
            stop(job)
        cleanup()
    for job, (_, err) in zip(jobs, results):
        assert job.returncode == 0, err[-3000:]
    main = 0 if (homes[0] / "run").exists() else 1      # c10d picks the host of rank 0
    lines = records(homes[main] / "run")
    assert lines[-1] == {"status": "finished"}
    updates = [r for r in lines if "updates" in r]
    assert [r["updates"] for r in updates] == list(range(1, 9))
    assert all(r["world_size"] == 2 for r in updates)
    assert updates[-1]["global_step"] == total
    assert list(homes[1 - main].iterdir()) == []
