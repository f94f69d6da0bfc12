"""The command line's edges: commands whose module or extra is missing, Ctrl-C, refused
option combinations of train/monitor/bench/profile, and the dashboard child of --monitor."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
import types

import pytest

from peregrine import cli
from peregrine.cli import main as cli_main
from peregrine.cli import train as train_cli
from polling import poll_until


def fake_command(monkeypatch, module_name, run):
    module = types.ModuleType(module_name)
    module.add_arguments = lambda parser: None
    module.run = run
    monkeypatch.setitem(sys.modules, module_name, module)
    monkeypatch.setitem(cli.COMMANDS, "fake", (module_name, "a command of this test"))


# ---- dispatch ------------------------------------------------------------------------

@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["-x"], 2), (["nope"], 2)])
def test_help_exits_0_and_an_unknown_command_exits_2(capsys, argv, code):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == code
    captured = capsys.readouterr()
    assert "COMMAND" in (captured.out if code == 0 else captured.err)


def test_ctrl_c_in_a_command_exits_130_without_a_traceback(monkeypatch, capsys):
    def run(args):
        raise KeyboardInterrupt
    fake_command(monkeypatch, "peregrine_test_interrupted", run)
    assert cli_main(["fake"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_missing_module_that_is_no_extra_is_a_real_error(monkeypatch, capsys):
    def run(args):
        __import__("peregrine_test_no_such_module")
    fake_command(monkeypatch, "peregrine_test_bug", run)
    with pytest.raises(ModuleNotFoundError, match="peregrine_test_no_such_module"):
        cli_main(["fake"])


def test_a_command_whose_module_is_gone_says_so(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "fake", ("peregrine.cli.no_such_command", "gone"))
    assert cli_main(["fake"]) == 2
    assert "peregrine fake: not available in this version" in capsys.readouterr().err


def test_a_command_module_needing_an_extra_names_the_extra(monkeypatch, tmp_path, capsys):
    (tmp_path / "peregrine_test_needs_torch.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    (tmp_path / "peregrine_test_needs_other.py").write_text("import peregrine_test_absent\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "fake", ("peregrine_test_needs_torch", "needs torch"))
    assert cli_main(["fake"]) == 2
    assert ("peregrine fake needs torch, which is not installed: pip install 'peregrine-rl[train]'"
            in capsys.readouterr().err)
    # a module that is neither the command's own nor an extra: a bug, raised as it is
    monkeypatch.setitem(cli.COMMANDS, "fake", ("peregrine_test_needs_other", "needs another"))
    with pytest.raises(ModuleNotFoundError, match="peregrine_test_absent"):
        cli_main(["fake"])


def test_version_falls_back_to_the_package_version_when_not_installed(monkeypatch):
    from importlib import metadata

    import peregrine

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", not_installed)
    assert cli.version() == peregrine.__version__


# ---- train ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("train") / "run"
    assert cli_main(["train", "cartpole", "--detach", "--run-dir", str(run_dir),
                     "--train.total-steps", "256", "--vec.num-envs", "4",
                     "--train.horizon", "16"]) == 0
    return run_dir


def test_what_every_rank_would_refuse_is_refused_once_before_any_starts(
        finished_run, capsys, monkeypatch, tmp_path):
    """--nproc: a backend or device this machine lacks, and a resume that changes what
    a resume may not, are one line from the launcher; no rank is started."""
    from peregrine.train import distributed
    from peregrine.train.checkpoint import load
    from peregrine.train.run_dir import checkpoint_path

    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks were started")
    monkeypatch.setattr(distributed, "launch", no_ranks)
    capsys.readouterr()
    assert cli_main(["train", "cartpole", "--nproc", "2", "--detach", "--run-dir",
                     str(tmp_path / "nccl"), "--train.dist-backend", "nccl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'nccl' needs train.device = 'cuda'" in err
    assert not (tmp_path / "nccl").exists()
    # a two-rank checkpoint (the finished run's, as if two ranks had written it)
    saved = {**load(checkpoint_path(finished_run)), "world_size": 2}
    monkeypatch.setattr(train_cli, "_saved_checkpoint", lambda run_dir: saved)
    assert cli_main(["train", "--resume", str(finished_run), "--nproc", "2",
                     "--vec.num-envs", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume cannot change vec.num_envs (4 in the " \
        "checkpoint, 8 now)" in err


@pytest.mark.parametrize("extra, message", [
    (["pendulum"], "is a 'cartpole' run, not 'pendulum'"),
    (["--config", "fast"], "--config cannot be combined with --resume"),
])
def test_resume_refuses_another_env_or_a_config(finished_run, capsys, extra, message):
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(finished_run), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_nproc_below_one_and_nproc_inside_torchrun_are_refused(monkeypatch, capsys):
    assert cli_main(["train", "cartpole", "--nproc", "0"]) == 2
    assert "--nproc must be >= 1, got 0" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["train", "cartpole", "--nproc", "2"]) == 2
    assert "--nproc cannot be used inside torchrun" in capsys.readouterr().err


@pytest.mark.parametrize("nproc", [["--nproc", "3"], ["--nproc=3"]])
def test_nproc_runs_the_same_command_without_nproc_in_each_rank(monkeypatch, nproc):
    from peregrine.train import distributed
    started = []
    monkeypatch.setattr(distributed, "launch", lambda count, argv, max_restarts=0:
                        started.append((count, argv, max_restarts)) or 0)
    argv = ["train", "cartpole", *nproc, "--detach", "--train.horizon", "16", "--seed=4"]
    assert cli_main(argv) == 0
    [(count, rank_argv, max_restarts)] = started
    assert (count, max_restarts) == (3, 0)
    # the run directory is named once, by the launcher, so restarted ranks find it again
    assert rank_argv[:5] == ["cartpole", "--detach", "--train.horizon", "16", "--seed=4"]
    assert rank_argv[5] == "--run-dir" and "cartpole-" in rank_argv[6] and len(rank_argv) == 7


def test_monitor_mode_starts_the_dashboard_and_waits_for_it(tmp_path, capfd):
    run_dir = tmp_path / "run"
    assert cli_main(["train", "cartpole", "--monitor", "--run-dir", str(run_dir),
                     "--train.total-steps", "256", "--vec.num-envs", "4",
                     "--train.horizon", "16"]) == 0
    out, err = capfd.readouterr()
    assert f"run directory: {run_dir}" in out and "finished: 256 steps" in out
    assert f"attached to {run_dir}" in err     # the child dashboard did attach
    assert "FINISHED" in out                   # ... and drew the final state before exiting


def test_nproc_must_be_an_int_or_auto(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", "cartpole", "--nproc", "two"])
    assert exit_info.value.code == 2
    assert "must be an int or 'auto', got 'two'" in capsys.readouterr().err


def test_nproc_auto_inside_torchrun_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["train", "cartpole", "--nproc", "auto"]) == 2
    assert "--nproc cannot be used inside torchrun" in capsys.readouterr().err


def test_nproc_auto_resumes_with_the_checkpoints_world_size(tmp_path, capsys):
    run_dir = tmp_path / "run"
    small = ["--train.total-steps", "128", "--vec.num-envs", "4", "--train.horizon", "16"]
    assert cli_main(["train", "cartpole", "--detach", "--run-dir", str(run_dir), *small]) == 0
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run_dir), "--nproc", "auto", "--detach",
                     "--train.total-steps", "256"]) == 0
    out = capsys.readouterr().out
    assert "--nproc auto: 1 rank(s), as the checkpoint was written" in out
    assert "finished: 256 steps" in out        # one rank, in this process


def test_the_launcher_reads_a_resumed_checkpoint_once(tmp_path, capsys, monkeypatch):
    """`--resume RUN --nproc auto` on a checkpoint of 2 ranks: the parent reads the
    checkpoint once (its world size) and launches 2 ranks, each of which loads it."""
    from peregrine.train import checkpoint, distributed
    from peregrine.train.run_dir import checkpoint_path
    run_dir = tmp_path / "run"
    small = ["--train.total-steps", "128", "--vec.num-envs", "4", "--train.horizon", "16"]
    assert cli_main(["train", "cartpole", "--detach", "--run-dir", str(run_dir), *small]) == 0
    state = checkpoint.load(checkpoint_path(run_dir))
    checkpoint.save(checkpoint_path(run_dir), {**state, "world_size": 2})
    loads, launched = [], []
    real_load = checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    monkeypatch.setattr(distributed, "launch", lambda n, argv, restarts: launched.append(n) or 0)
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run_dir), "--nproc", "auto", "--detach"]) == 0
    assert "--nproc auto: 2 rank(s), as the checkpoint was written" in capsys.readouterr().out
    assert launched == [2] and len(loads) == 1


class FakeProcess:
    """Popen's wait/terminate/kill as a dashboard that ignores what it is told `ignore` times."""

    def __init__(self, ignore, interrupt=False):
        self.ignore, self.interrupt, self.calls = ignore, interrupt, []

    def wait(self, timeout=None):
        self.calls.append(("wait", timeout))
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        if self.ignore > 0 and timeout is not None:
            self.ignore -= 1
            raise subprocess.TimeoutExpired("monitor", timeout)
        return 0

    def terminate(self):
        self.calls.append(("terminate",))

    def kill(self):
        self.calls.append(("kill",))


@pytest.mark.parametrize("process, calls", [
    (FakeProcess(0), [("wait", 3.0)]),
    (FakeProcess(1), [("wait", 3.0), ("terminate",), ("wait", 2.0)]),
    (FakeProcess(2), [("wait", 3.0), ("terminate",), ("wait", 2.0), ("kill",), ("wait", None)]),
    (FakeProcess(0, interrupt=True), [("wait", 3.0), ("kill",), ("wait", None)]),
])
def test_a_lingering_dashboard_is_terminated_then_killed(process, calls):
    train_cli._finish_monitor(process)
    assert process.calls == calls
    train_cli._finish_monitor(None)     # no child: nothing to do


def test_a_real_dashboard_that_ignores_sigterm_is_killed():
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    started = time.monotonic()
    train_cli._finish_monitor(child, grace=0.1)
    assert child.returncode == -9 and time.monotonic() - started < 30
    child.stdout.close()


# ---- monitor ---------------------------------------------------------------------------

def monitor(capsys, *argv):
    code = cli_main(["monitor", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("argv, message", [
    (["--interval", "0"], "--interval must be positive, got 0.0"),
    (["--width", "39"], "--width must be at least 40, got 39"),
])
def test_monitor_bad_numbers_exit_2(tmp_path, capsys, argv, message):
    code, _, err = monitor(capsys, "--list", "--runs-dir", tmp_path, *argv)
    assert code == 2 and message in err


def test_list_of_a_missing_folder_is_an_empty_table(tmp_path, capsys):
    code, out, _ = monitor(capsys, "--list", "--runs-dir", tmp_path / "nowhere")
    assert code == 0 and "runs in" in out and "nowhere" in out
    assert "finished" not in out and "running" not in out


def test_list_shows_unreadable_and_starting_runs(tmp_path, capsys):
    from peregrine.monitor.metrics import MetricsWriter
    runs = tmp_path / "runs"
    done = MetricsWriter(runs / "done", [])
    done.update(global_step=4321, updates=1)
    done.close("finished")
    fresh = MetricsWriter(runs / "fresh", [])       # created, nothing published yet
    (runs / "broken").mkdir()
    (runs / "broken" / "metrics.bin").write_bytes(b"GIF89a" + b"\0" * 200)
    code, out, _ = monitor(capsys, "--list", "--runs-dir", runs, "--width", "200")
    fresh.close("finished")
    assert code == 0
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ")
            and line.split()[1] in ("done", "fresh", "broken")}
    assert set(rows) == {"done", "fresh", "broken"}
    assert "4,321" in rows["done"] and "finished" in rows["done"]
    assert "unreadable: metrics file is not a Peregrine metrics file" in rows["broken"]
    assert "starting" in rows["fresh"]
    # the unreadable one is ordered by its file's time, the readable ones by their start
    assert out.index("broken") > out.index("fresh") > out.index("done")


def test_live_view_follows_a_new_run_in_the_same_directory(tmp_path, capsys):
    """The live view (in this process) attaches, switches to the file a restarted run
    writes in the same directory, and ends when that run finishes."""
    import threading

    from peregrine.cli import monitor as monitor_cli
    from peregrine.monitor.metrics import MetricsReader, MetricsWriter
    run_dir = tmp_path / "run"
    first = MetricsWriter(run_dir, [])
    first.update(global_step=100, updates=1)
    seen = []
    original = MetricsReader.__init__

    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self.inode)

    def restart():
        poll_until(lambda: len(seen) >= 1, 20, 0.01)
        time.sleep(0.3)
        second = MetricsWriter(run_dir, [])       # renamed over the first: another inode
        second.update(global_step=999_999, updates=1)
        poll_until(lambda: len(seen) >= 2, 20, 0.01)
        second.close("finished")
        first.close("interrupted")                # the old file, no longer the run's

    MetricsReader.__init__ = recording_init
    thread = threading.Thread(target=restart)
    thread.start()
    try:
        args = argparse.Namespace(wait=5.0, interval=0.05, stale_after=10.0, stay=False)
        assert monitor_cli.live(run_dir, args) == 0
    finally:
        MetricsReader.__init__ = original
        thread.join(timeout=30)
    assert len(seen) == 2 and seen[0] != seen[1]
    out = capsys.readouterr().out
    assert "999,999" in out and "FINISHED" in out


def test_a_file_that_is_not_a_metrics_file_is_not_a_run(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = monitor(capsys, tmp_path / "notes.txt", "--once")
    assert code == 1 and "is a file, not a run directory or its metrics.bin" in err


def test_ctrl_c_while_waiting_for_a_run_detaches(tmp_path, monkeypatch, capsys):
    from peregrine.cli import monitor as monitor_cli

    def interrupted(run_dir):          # Ctrl-C arrives while it polls for the file
        raise KeyboardInterrupt
    monkeypatch.setattr(monitor_cli, "MetricsReader", interrupted)
    code, _, err = monitor(capsys, tmp_path / "not-started-yet")
    assert code == 0 and "peregrine monitor: detached" in err


def test_waiting_for_a_run_gives_up_after_wait_seconds(tmp_path, capsys):
    started = time.monotonic()
    code, _, err = monitor(capsys, tmp_path / "never", "--wait", "0.3")
    assert code == 1 and "never" in err
    assert 0.25 <= time.monotonic() - started < 30


# ---- bench and profile -----------------------------------------------------------------

def test_bench_prints_a_human_summary(capsys):
    assert cli_main(["bench", "cartpole", "--num-envs", "16", "--seconds", "0.05"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cartpole: 16 envs x 1 agents, 1 thread(s), ")
    assert "env steps/s   :" in out and "agent steps/s :" in out


def test_bench_refuses_a_non_positive_duration():
    with pytest.raises(SystemExit, match="--seconds must be positive"):
        cli_main(["bench", "cartpole", "--seconds", "0"])


def profile(tmp_path, capsys, *argv):
    code = cli_main(["profile", *map(str, argv), "--artifacts-dir", str(tmp_path / "artifacts")])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("argv, message", [
    (["--warmup", "-1"], "--warmup must be >= 0, got -1.0"),
    (["--eval-interval", "0"], "--eval-interval and --eval-episodes must be positive"),
    (["--eval-episodes", "0"], "--eval-interval and --eval-episodes must be positive"),
    (["--threads", "0"], "--threads must be a positive int, got 0"),
])
def test_profile_refuses_bad_numbers(tmp_path, capsys, argv, message):
    code, _, err = profile(tmp_path, capsys, "cartpole", *argv)
    assert code == 2 and message in err


def test_profile_json_to_stdout_and_artifacts_never_overwrite(tmp_path, capsys, monkeypatch):
    from datetime import datetime, timezone

    from peregrine.profile import machine
    frozen = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    monkeypatch.setattr(machine, "utc_now", lambda: frozen)
    tiny = ["cartpole", "--seconds", "0.05", "--warmup", "0", "--num-envs", "16", "--threads", "1"]
    for _ in range(3):
        code, out, _ = profile(tmp_path, capsys, *tiny, "--json", "-")
        assert code == 0
        artifact = json.loads(out)      # stdout holds the artifact and nothing else
        assert artifact["schema"] == "peregrine.profile/1" and artifact["setup"]["num_envs"] == 16
    names = sorted(path.name for path in (tmp_path / "artifacts").iterdir())
    assert names == ["20300102T030405Z_cartpole_env_only-1.json",
                     "20300102T030405Z_cartpole_env_only-2.json",
                     "20300102T030405Z_cartpole_env_only.json"]


def test_profile_trainer_mode_takes_threads(tmp_path, capsys):
    code, out, _ = profile(tmp_path, capsys, "cartpole", "--mode", "trainer", "--seconds", "0.05",
                           "--warmup", "0", "--num-envs", "4", "--threads", "2",
                           "--set", "train.horizon=8", "--set", "train.minibatch_size=32",
                           "--no-artifact", "--json", tmp_path / "a.json")
    assert code == 0, out
    artifact = json.loads((tmp_path / "a.json").read_text())
    assert artifact["setup"]["num_threads"] == 2 and artifact["setup"]["num_envs"] == 4
    assert ["vec.num_threads", 2] in artifact["setup"]["overrides"]


def test_profile_of_a_multi_agent_env_reports_env_steps_too(tmp_path, capsys):
    code, out, _ = profile(tmp_path, capsys, "drone_swarm", "--seconds", "0.05", "--warmup", "0",
                           "--num-envs", "2", "--no-artifact", "--json", tmp_path / "a.json")
    assert code == 0, out
    artifact = json.loads((tmp_path / "a.json").read_text())
    agents = artifact["setup"]["agents_per_env"]
    steady = artifact["steady_state"]
    assert agents > 1
    assert steady["env_steps_per_sec"] == pytest.approx(steady["steps_per_sec"] / agents)
    line = next(line for line in out.splitlines() if "env steps/s" in line)
    assert line.startswith("  env steps/s      : ")


def test_a_run_file_removed_while_watched_is_not_taken_for_a_new_run(tmp_path):
    from peregrine.cli import monitor as monitor_cli
    from peregrine.monitor.metrics import MetricsReader, MetricsWriter
    writer = MetricsWriter(tmp_path / "run", [])
    with MetricsReader(tmp_path / "run") as reader:
        assert not monitor_cli._replaced(reader)
        (tmp_path / "run" / "metrics.bin").unlink()
        assert not monitor_cli._replaced(reader)      # gone: keep showing what was read
        MetricsWriter(tmp_path / "run", []).close("finished")
        assert monitor_cli._replaced(reader)          # a new file in its place: a new run
    writer.close("finished")


def test_what_a_newcomer_mistypes_is_one_line(tmp_path, capsys, monkeypatch):
    """Step counts and seeds are read like --train.KEY values; a checkpoint path that
    does not exist says so; monitor takes a path as given; a factory that cannot
    render says why; new-env's install line is a path pip cannot take for a name."""
    def refused(*argv):         # exit 2 (returned, or argparse's SystemExit), one line
        try:
            code = cli_main(list(argv))
        except SystemExit as exit_info:
            code = exit_info.code
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        return err

    assert "train.total_steps must be an integer, got 'abc'" in refused(
        "train", "cartpole", "--detach", "--total-steps", "abc")
    assert "train.seed must be an integer, got 'x'" in refused(
        "train", "cartpole", "--detach", "--seed", "x")
    for command in (["eval"], ["render", "--out", str(tmp_path / "x.gif")]):
        assert f"no checkpoint at '{tmp_path / 'nowhere'}': no such file" in refused(
            *command, "--policy", str(tmp_path / "nowhere"))
    code, _, err = monitor(capsys, "--once", "--runs-dir", tmp_path, "runs/nonexist")
    assert code != 0 and "no run 'runs/nonexist'" in err and "runs/runs" not in err
    assert "does not take render_mode, which render makes it with" in refused(
        "render", "any_env_toys:chain_env", "--out", str(tmp_path / "x.gif"))
    monkeypatch.chdir(tmp_path)
    import warnings
    python_format = warnings.formatwarning
    assert cli_main(["new-env", "walker_two"]) == 0
    assert f"pip install --no-build-isolation .{os.sep}walker_two\n" in capsys.readouterr().out
    assert warnings.formatwarning is python_format      # the command's format was its own
    assert "'class' is a Python keyword" in refused("new-env", "class")
    assert not (tmp_path / "class").exists()


def test_the_printed_eval_command_carries_the_pythonpath_a_factory_needed(monkeypatch):
    from types import SimpleNamespace

    def prefix(name, wrappers=None):
        return train_cli._path_prefix(SimpleNamespace(
            env_name=name, env={"name": name, **({"wrappers": wrappers} if wrappers else {})}))
    monkeypatch.setenv("PYTHONPATH", "my folder")
    assert prefix("my_envs:corridor") == "PYTHONPATH='my folder' "
    assert prefix("cartpole") == ""
    assert prefix("gym:CartPole-v1") == ""
    # a wrapper of the user's own module needs it too (the printed command failed)
    assert prefix("gym:CartPole-v1", [{"name": "my_wrappers:Downsample", "k": 6}]) == \
        "PYTHONPATH='my folder' "
    assert prefix("gym:CartPole-v1", ["NormalizeObservation"]) == ""
    monkeypatch.delenv("PYTHONPATH")
    assert prefix("my_envs:corridor") == ""


def test_render_size_scales_every_envs_frames_and_is_checked(tmp_path, capsys):
    """--size is the frame's longer side for every env (CartPole draws 600 x 400 and is
    scaled); out of [32, 2048] it is refused, not ignored."""
    from PIL import Image
    out = tmp_path / "cartpole.gif"
    assert cli_main(["render", "cartpole", "--out", str(out), "--steps", "4", "--size", "150"]) == 0
    with Image.open(out) as gif:
        assert gif.size == (150, 100)
    assert cli_main(["render", "cartpole", "--out", str(out), "--steps", "4"]) == 0
    with Image.open(out) as gif:
        assert gif.size == (600, 400)                 # the env's own size by default
    for bad in ("0", "-1", "100000", "big"):
        with pytest.raises(SystemExit):
            cli_main(["render", "cartpole", "--out", str(out), "--size", bad])
        assert f"--size: must be an int in [32, 2048], got '{bad}'" in capsys.readouterr().err


def test_render_samples_a_checkpoints_actions_as_eval_can(tmp_path, capsys):
    """render had no --sample: a policy scored with `eval --sample` could only be drawn
    taking its most likely actions."""
    run = tmp_path / "run"
    assert cli_main(["train", "cartpole", "--detach", "--run-dir", str(run), "--total-steps",
                     "256", "--vec.num-envs", "8"]) == 0
    out = tmp_path / "episode.gif"
    assert cli_main(["render", "--policy", str(run), "--out", str(out), "--sample",
                     "--steps", "6"]) == 0
    assert out.is_file()
    assert cli_main(["render", "cartpole", "--out", str(out), "--sample"]) == 2
    assert "sampling actions applies to a checkpoint's policy" in capsys.readouterr().err
