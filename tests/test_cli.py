"""The command line: envs, bench, errors; and a light core import."""
import json
import subprocess
import sys

import peregrine

PEREGRINE = [sys.executable, "-m", "peregrine.cli"]


def run(*args, timeout=120):
    return subprocess.run(PEREGRINE + list(args), capture_output=True, text=True, timeout=timeout)


def test_envs_lists_every_registered_env_with_spaces():
    result = run("envs", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == set(peregrine.list_envs())
    assert rows["cartpole"]["action_space"].startswith("Discrete(2")
    assert rows["cartpole"]["agents_per_env"] == 1
    text = run("envs", "cartpole")
    assert "max_steps = 500" in text.stdout


def test_bench_reports_env_and_agent_steps_per_second():
    result = run("bench", "cartpole", "--num-envs", "64", "--threads", "2", "--seconds", "0.2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["num_envs"] == 64 and report["num_threads"] == 2
    assert report["env_steps_per_sec"] > 0
    assert report["agent_steps_per_sec"] == report["env_steps_per_sec"] * report["agents_per_env"]


def test_bad_arguments_give_a_message_not_a_traceback():
    result = run("bench", "no_such_env", "--seconds", "0.1")
    assert result.returncode == 2
    assert "unknown env 'no_such_env'" in result.stderr and "Traceback" not in result.stderr
    result = run("bench", "cartpole", "--num-envs", "0", "--seconds", "0.1")
    assert result.returncode == 2 and "num_envs" in result.stderr
    assert run("no_such_command").returncode == 2


def test_core_import_is_light():
    code = ("import sys, peregrine; env = peregrine.make('cartpole', num_envs=2);"
            "heavy = [m for m in ('torch', 'rich', 'matplotlib', 'PIL') if m in sys.modules];"
            "print(','.join(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
