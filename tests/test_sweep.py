"""`peregrine sweep`: a small CartPole sweep that prunes and exports its best
variant, a sweep killed mid-trial and resumed, and the one-line errors."""
from __future__ import annotations

import csv
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from peregrine.cli import main as cli_main  # noqa: E402
from peregrine.sweep import (SweepError, intermediate_value, load_sweep, objective_value,  # noqa: E402
                             run_sweep)
from peregrine.train.config import load_config  # noqa: E402
from polling import poll_until  # noqa: E402

# A few thousand steps per seed: CartPole's shipped lr 5e-3 gets past ~100 return,
# lr 0 stays at a random policy's ~22.
BUDGET = """
[vec]
num_envs = 16

[train]
total_steps = {steps}
horizon = 32
stop_return = 0.0
progress_interval = 1
checkpoint_interval = 0
tensorboard = false
"""


def write_sweep(folder: Path, sweep: str, steps: int = 4096, name: str = "tiny") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(sweep + BUDGET.format(steps=steps))
    return path


def study_rows(db: Path) -> dict[int, tuple[str, float | None, bool]]:
    """trial number -> (state, value, whether its process said its pid), read from
    the SQLite file as another process sees it."""
    with sqlite3.connect(db, timeout=30) as connection:
        rows = connection.execute(
            "SELECT t.number, t.state, v.value, EXISTS(SELECT 1 FROM trial_user_attributes a "
            "WHERE a.trial_id = t.trial_id AND a.key = 'pid') FROM trials t "
            "LEFT JOIN trial_values v ON v.trial_id = t.trial_id").fetchall()
    return {number: (state, value, bool(pid)) for number, state, value, pid in rows}


def test_sweep_prunes_a_hopeless_trial_and_exports_the_best(tmp_path, capsys):
    # Trial 0: the shipped learning rate; trial 1: lr 0, which never learns and is
    # pruned once trial 0's curve is above it at the same step.
    file = write_sweep(tmp_path, """
[sweep]
env = "cartpole"
trials = 3
seeds = [1, 2]
eval_episodes = 8
sampler = { name = "random", seed = 3 }
pruner = { name = "median", n_startup_trials = 1, n_warmup_steps = 1000 }
enqueue = [{ "train.learning_rate" = 5e-3 }, { "train.learning_rate" = 0.0 }]

[sweep.params]
"train.learning_rate" = { choice = [5e-3, 0.0, 2e-3] }
"train.gamma" = { uniform = [0.95, 0.99] }
""")
    sweep = load_sweep(file, directory=tmp_path / "sweep")
    assert run_sweep(sweep, jobs=1, live=False) == 0
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="tiny", storage=sweep.storage)
    trials = study.get_trials()
    assert len(trials) == 3
    assert trials[0].state.name == "COMPLETE" and trials[0].params["train.learning_rate"] == 5e-3
    assert trials[1].state.name == "PRUNED" and trials[1].params["train.learning_rate"] == 0.0
    assert "trial 1 PRUNED" in out
    # The objective is the median over the seeds, each evaluated from its own run.
    seeds = trials[0].user_attrs["seed_values"]
    assert len(seeds) == 2 and trials[0].value == pytest.approx(sum(seeds) / 2)
    assert trials[0].value > 60      # learned, well above a random policy
    for seed in (1, 2):
        assert (tmp_path / "sweep/trials/0000" / f"seed-{seed}/checkpoints/latest.pt").is_file()
    # best.toml: a variant that load_config (so `peregrine train --config`) accepts.
    best = min((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: -t.value)
    config = load_config("cartpole", tmp_path / "sweep/best.toml")
    assert config.train.learning_rate == best.params["train.learning_rate"]
    assert config.train.gamma == pytest.approx(best.params["train.gamma"])
    assert config.train.total_steps == 4096 and config.vec.num_envs == 16
    assert (tmp_path / "sweep/history.png").stat().st_size > 1000
    # trials.csv: every trial, as the study holds it
    with open(tmp_path / "sweep/trials.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [(int(r["trial"]), r["state"]) for r in rows] == [(t.number, t.state.name)
                                                             for t in trials]
    assert float(rows[0]["median"]) == trials[0].value
    assert [float(v) for v in rows[0]["seed_values"].split()] == seeds
    assert float(rows[1]["train.learning_rate"]) == 0.0 and rows[1]["median"] == ""
    assert int(rows[1]["pruned_step"]) == trials[1].user_attrs["pruned_at"]["global_step"]
    assert float(rows[1]["pruned_value"]) == trials[1].intermediate_values[trials[1].last_step]
    assert rows[0]["pruned_step"] == rows[0]["pruned_value"] == ""
    assert float(rows[2]["train.gamma"]) == trials[2].params["train.gamma"]
    # Run again: nothing left to do, no trial added.
    assert run_sweep(sweep, jobs=1, live=False) == 0
    assert len(study.get_trials()) == 3


KILLABLE = """
[sweep]
env = "cartpole"
trials = 3
seeds = [1]
eval_episodes = 4
pruner = "none"
sampler = { name = "random", seed = 5 }

[sweep.params]
"train.learning_rate" = { log_uniform = [1e-3, 1e-2] }
"""


def stop_in_the_second_trial(tmp_path, signal_number):
    """Starts a sweep of 3 trials in a session of its own and sends `signal_number` to
    that whole process group (as a terminal's Ctrl-C does) once trial 0 is done and
    trial 1 trains. Returns (command, env, folder, the rows before, its output)."""
    file = write_sweep(tmp_path, KILLABLE, steps=8192)
    folder = tmp_path / "sweep"
    command = [sys.executable, "-m", "peregrine.cli", "sweep", str(file), "--dir", str(folder)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    db, before = folder / "study.db", {}
    try:
        def second_trial_training():     # trial 0 done, trial 1 RUNNING with its pid said
            nonlocal before
            if db.is_file():
                try:
                    before = study_rows(db)
                except sqlite3.OperationalError:   # tables not made yet
                    before = {}
            assert process.poll() is None, process.stdout.read().decode()
            return before.get(0, ("",))[0] == "COMPLETE" and before.get(1, ("",))[::2] == (
                "RUNNING", True)

        if not poll_until(second_trial_training, 120):
            pytest.fail(f"no second trial running in time: {before}")
    finally:
        os.killpg(process.pid, signal_number)
        output = process.communicate(timeout=120)[0].decode()
    return command, env, folder, before, (process.returncode, output)


def test_sweep_stopped_by_ctrl_c_says_so_and_counts_the_trial_as_interrupted(tmp_path):
    """Ctrl-C: exit 130, the stopped trial FAIL but "interrupted" (not "failed"), one
    line saying how to continue, none of Optuna's reports of the stopped trial."""
    _, _, folder, _, (code, output) = stop_in_the_second_trial(tmp_path, signal.SIGINT)
    assert code == 130, output
    assert "1/3 trials done (0 pruned, 0 failed, 1 interrupted)" in output
    assert "peregrine sweep: interrupted with 1 of 3 trials: the same command continues" \
        in output
    assert "failed with" not in output and "Traceback" not in output, output
    assert study_rows(folder / "study.db")[1][0] == "FAIL"


def test_sweep_killed_mid_trial_resumes_without_losing_or_repeating(tmp_path):
    command, env, folder, before, _ = stop_in_the_second_trial(tmp_path, signal.SIGKILL)
    db = folder / "study.db"
    first = folder / "trials/0000/seed-1/checkpoints/latest.pt"
    first_written = first.stat().st_mtime_ns
    resumed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "trial(s) [1] were running when the sweep was stopped: marked FAIL" in resumed.stdout
    after = study_rows(db)
    assert after[0] == before[0]                   # the finished trial kept, not rerun
    assert after[1][0] == "FAIL"                   # the killed one failed, not counted
    counted = [n for n, (state, _, _) in after.items() if state in ("COMPLETE", "PRUNED")]
    assert len(counted) == 3 and len(after) == 4   # reached `trials`, nothing extra
    # Trial 0 was not trained again; the new trials trained into folders of their own.
    assert first.stat().st_mtime_ns == first_written
    assert {"0002", "0003"} <= {p.name for p in (folder / "trials").iterdir()}
    assert load_config("cartpole", folder / "best.toml").train.total_steps == 8192


SPACE = """
[sweep]
env = "cartpole"
trials = 2
{extra}
[sweep.params]
{param}
"""


@pytest.mark.parametrize("param, extra, message", [
    ('"train.learning_rate" = { normal = [0, 1] }', "",
     "must be a table with one distribution of ['uniform', 'log_uniform', 'int', 'choice']"),
    ('"train.learning_rate" = { uniform = [1e-2, 1e-4] }', "", "bounds must have low < high"),
    ('"train.learning_rate" = { log_uniform = [0, 1e-2] }', "", "a log scale needs low > 0"),
    ('"train.update_epochs" = { int = [1.5, 4] }', "", "int takes [low, high] (integers)"),
    ('"train.learnin_rate" = { uniform = [1e-4, 1e-2] }', "", "unknown config key train.learnin_rate"),
    ('"train.gamma" = { uniform = [0.5, 1.5] }', "", "train.gamma must be in [0, 1], got 1.5"),
    ('"policy.activation" = { choice = ["tanh", "gelu"] }', "", "is not one of ['tanh', 'relu']"),
    ('"train.gamma" = { uniform = [0.9, 0.99] }', 'storage = "nosuchdb://x"',
     "storage 'nosuchdb://x' cannot be opened"),
    ('"train.gamma" = { uniform = [0.9, 0.99] }', 'storage = "study.db"',
     "storage 'study.db' is not a database URL"),
    ('"train.gamma" = { uniform = [0.9, 0.99] }', 'objective = "best"',
     "objective = 'best' is not one of ['median', 'worst', 'mean']"),
])
def test_bad_space_or_storage_is_one_line_before_training(tmp_path, capsys, param, extra, message):
    file = tmp_path / "bad.toml"
    file.write_text(SPACE.format(param=param, extra=extra))
    assert cli_main(["sweep", str(file), "--dir", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("peregrine sweep: error: ") and message in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "sweep" / "trials").exists()


def test_resumed_sweep_with_another_space_is_refused(tmp_path):
    file = tmp_path / "s.toml"
    file.write_text(SPACE.format(param='"train.gamma" = { uniform = [0.9, 0.99] }', extra=""))
    from peregrine.sweep import open_storage, open_study
    sweep = load_sweep(file, directory=tmp_path)
    open_study(sweep, open_storage(sweep.storage))
    file.write_text(SPACE.format(param='"train.gamma" = { uniform = [0.9, 0.98] }', extra=""))
    changed = load_sweep(file, directory=tmp_path)
    with pytest.raises(SweepError, match="made from a different sweep"):
        open_study(changed, open_storage(changed.storage))


def test_objective_statistics_and_intermediate_values():
    values = [3.0, 9.0, 5.0]
    assert objective_value(values, "median", "maximize") == 5.0
    assert objective_value(values, "mean", "maximize") == pytest.approx(17 / 3)
    assert objective_value(values, "worst", "maximize") == 3.0
    assert objective_value(values, "worst", "minimize") == 9.0
    record = {"recent_return": 42.0, "episode_length": 7.0, "env_stats": {"delivered": 3.5}}
    assert intermediate_value(record, "episode_return") == 42.0
    assert intermediate_value(record, "episode_length") == 7.0
    assert intermediate_value(record, "delivered") == 3.5
    assert intermediate_value(record, "missing") is None


def test_a_metric_the_env_lacks_is_refused_before_any_trial_trains(tmp_path, capsys):
    file = tmp_path / "metric.toml"
    file.write_text(SPACE.format(param='"train.gamma" = { uniform = [0.9, 0.99] }',
                                 extra='metric = "delivered"'))
    assert cli_main(["sweep", str(file), "--dir", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metric 'delivered' is not an evaluation statistic of " \
        "cartpole; its statistics: ['episode_length', 'episode_return']" in err
    assert not (tmp_path / "sweep" / "trials").exists()


def test_a_directory_holding_another_sweeps_trials_is_refused(tmp_path, capsys):
    directory = tmp_path / "shared"
    (directory / "trials" / "0000").mkdir(parents=True)
    (directory / "sweep-name").write_text("tiny\n")
    file = tmp_path / "other.toml"
    file.write_text(SPACE.format(param='"train.gamma" = { uniform = [0.9, 0.99] }', extra=""))
    assert cli_main(["sweep", str(file), "--dir", str(directory)]) == 2
    err = capsys.readouterr().err
    assert "holds the trials of sweep 'tiny', not 'other': give this sweep its own --dir" in err
    assert not (directory / "study.db").exists()
    # a directory from before the marker: its study.db names the sweep it belongs to
    (directory / "sweep-name").unlink()
    optuna.create_study(storage=f"sqlite:///{directory / 'study.db'}", study_name="tiny")
    assert cli_main(["sweep", str(file), "--dir", str(directory)]) == 2
    assert "holds the trials of sweep 'tiny'" in capsys.readouterr().err


def test_a_trial_stopped_by_ctrl_c_is_not_reported_with_a_traceback():
    import logging
    from peregrine.sweep import NotAnInterrupt

    def record(error, number=4):
        try:
            raise error
        except BaseException:
            return logging.LogRecord("optuna", logging.WARNING, __file__, 1,
                                     f"Trial {number} failed with parameters: {{}}", None,
                                     sys.exc_info())

    def value_line(number):
        return logging.LogRecord("optuna", logging.WARNING, __file__, 1,
                                 f"Trial {number} failed with value None.", None, None)
    drop = NotAnInterrupt()
    assert not drop.filter(record(KeyboardInterrupt()))
    assert not drop.filter(value_line(4))             # Optuna's second line on the same trial
    assert drop.filter(record(ValueError("training diverged"), 5))     # still reported
    assert drop.filter(value_line(5))
    assert drop.filter(logging.LogRecord("optuna", logging.INFO, __file__, 1, "x", None, None))
