"""The first mistake is instant: `peregrine train` checks its arguments and the
config (env name, keys, values, variants) before importing torch, so a wrong
command costs one line in a fraction of a second rather than the seconds torch
takes to import. And the TensorBoard notice is shown once per machine, not on
every run.

The wall-time bound (1.5 s) is generous for a loaded CI machine; the check that
cannot flake is that torch was never imported when the error came.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from peregrine.train.run_log import TENSORBOARD_NOTICE_MARKER, RunLogger

WALL_LIMIT_S = 1.5
NOTICE = "TensorBoard event files skipped: tensorboard is not installed"

# (arguments after `peregrine`, text the last line of stderr must contain)
CASES = [
    (["train", "cartpol"], "unknown env 'cartpol'"),
    (["train", "cartpole", "--vec.num-envs", "-3"], "vec.num_envs must be >= 1, got -3"),
    (["train", "cartpole", "--train.no-such-key", "1"], "unknown config key train.no_such_key"),
    (["train", "cartpole", "--nosuch.key", "1"], "config key 'nosuch.key' must look like"),
    (["train", "cartpole", "--train.learning-rate", "fast"], "train.learning_rate must be a number"),
    (["train", "cartpole", "--config", "nosuch"],
     "'nosuch' is neither a file nor a shipped variant"),
    (["train", "cartpole", "--train.learning-rate"], "override --train.learning-rate needs a value"),
    (["train", "cartpole", "--nproc", "0"], "--nproc must be >= 1, got 0"),
    (["train", "cartpole", "--seed", "x"], "train.seed must be an integer, got 'x'"),
]
IDS = ["unknown-env", "bad-value", "unknown-key", "unknown-section", "wrong-type",
       "unknown-variant", "missing-value", "bad-nproc", "bad-seed"]

# Calls the CLI in this process and reports whether torch got imported.
IN_PROCESS = """
import json, sys
from peregrine.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("argv, expected", CASES, ids=IDS)
def test_a_bad_command_fails_in_one_line_before_torch_is_imported(argv, expected, tmp_path):
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "peregrine", *argv], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    wall = time.perf_counter() - start
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert expected in lines[-1]
    # One line of our own; argparse's syntax errors come after its usage line.
    assert len(lines) == 1 or lines[0].startswith("usage: peregrine train"), result.stderr
    assert wall < WALL_LIMIT_S, f"{argv}: the error took {wall:.2f} s"
    assert not any(tmp_path.iterdir()), "an error left files behind (a run directory?)"

    result = subprocess.run([sys.executable, "-c", IN_PROCESS, *argv], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"code": 2, "torch": False}, result.stderr


def test_a_bad_key_in_a_config_file_fails_before_torch_is_imported(tmp_path):
    config = tmp_path / "mine.toml"
    config.write_text("[train]\nlearning_rat = 3e-4\n")
    result = subprocess.run([sys.executable, "-c", IN_PROCESS, "train", "cartpole",
                             "--config", str(config)], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"code": 2, "torch": False}
    assert "unknown config key train.learning_rat" in result.stderr
    assert str(config) in result.stderr


def _open_logger(run_dir):
    RunLogger(run_dir, (), tensorboard=True, dashboard=False).close("finished")


def test_the_tensorboard_notice_is_shown_once_per_machine(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PEREGRINE_CACHE", str(cache))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # not installed
    _open_logger(tmp_path / "first")
    assert NOTICE in capsys.readouterr().err
    assert (cache / TENSORBOARD_NOTICE_MARKER).is_file()
    _open_logger(tmp_path / "second")
    _open_logger(tmp_path / "third")
    assert NOTICE not in capsys.readouterr().err

    # Another machine (another cache folder) has not seen it yet.
    monkeypatch.setenv("PEREGRINE_CACHE", str(tmp_path / "other-cache"))
    _open_logger(tmp_path / "fourth")
    assert NOTICE in capsys.readouterr().err


def test_an_unwritable_cache_folder_keeps_showing_the_notice(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PEREGRINE_CACHE", str(blocker / "cache"))   # cannot be created
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    _open_logger(tmp_path / "first")
    _open_logger(tmp_path / "second")
    assert capsys.readouterr().err.count(NOTICE) == 2
