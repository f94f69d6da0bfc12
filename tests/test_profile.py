"""`peregrine profile`: artifacts, the JSON schema and exit codes under --enforce-target."""
from __future__ import annotations

import json

import pytest

from peregrine.cli import main as peregrine_main
from peregrine.cli import profile as profile_cli
from peregrine.profile import runner

TINY = ["--seconds", "0.2", "--warmup", "0.05", "--num-envs", "16"]


def profile(tmp_path, capsys, *argv):
    code = peregrine_main(["profile", *map(str, argv), "--artifacts-dir", str(tmp_path / "artifacts")])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def only_artifact(tmp_path):
    files = list((tmp_path / "artifacts").glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text()), files[0]


def test_env_only_target_met_exits_0_and_writes_the_artifact(tmp_path, capsys):
    code, out, _ = profile(tmp_path, capsys, "cartpole", *TINY, "--json", tmp_path / "copy.json",
                           "--target-steps-per-sec", 1, "--enforce-target")
    assert code == profile_cli.EXIT_OK
    artifact, path = only_artifact(tmp_path)
    assert path.name.endswith("_cartpole_env_only.json") and path.name[:8].isdigit()
    assert json.loads((tmp_path / "copy.json").read_text()) == artifact
    assert artifact["schema"] == "peregrine.profile/1" and artifact["mode"] == "env_only"
    steady = artifact["steady_state"]
    assert steady["steps_per_sec"] > 0 and steady["steps"] % (16 * 16) == 0
    assert steady["steps"] == steady["units"] * artifact["setup"]["steps_per_unit"]
    assert steady["unit_steps_per_sec"]["min"] <= steady["unit_steps_per_sec"]["max"]
    assert artifact["warmup"]["units"] >= 1 and steady["seconds"] >= 0.2
    assert set(artifact["time_split_fraction"]) == {"env", "other"}
    assert artifact["time_split_fraction"]["env"] > 0.5
    assert artifact["target"] == {"steps_per_sec": 1.0, "met": True, "enforced": True,
                                  "ratio": pytest.approx(steady["steps_per_sec"])}
    assert artifact["exit_code"] == 0
    for key in ("cpu_model", "logical_cores", "python", "numpy", "torch"):
        assert key in artifact["machine"]
    assert "hash" in artifact["commit"] and artifact["date"].endswith("+00:00")
    assert "steps/s (steady)" in out and str(path) in out


def test_env_only_target_missed_exits_3_only_when_enforced(tmp_path, capsys):
    code, _, err = profile(tmp_path, capsys, "cartpole", *TINY, "--target-steps-per-sec", 1e15,
                           "--enforce-target")
    assert code == profile_cli.EXIT_TARGET_MISSED == 3
    assert "below the target" in err
    artifact, path = only_artifact(tmp_path)
    assert artifact["target"]["met"] is False and artifact["exit_code"] == 3
    path.unlink()
    code, out, _ = profile(tmp_path, capsys, "cartpole", *TINY, "--target-steps-per-sec", 1e15)
    assert code == 0 and "NOT met" in out          # recorded, not enforced


def test_trainer_mode_times_ppo_updates(tmp_path, capsys):
    code, out, _ = profile(tmp_path, capsys, "cartpole", "--mode", "trainer", "--seconds", "0.1",
                           "--warmup", "0", "--num-envs", "8", "--set", "train.horizon=16",
                           "--set", "train.minibatch_size=64", "--target-steps-per-sec", 1,
                           "--enforce-target")
    assert code == 0, out
    artifact, _ = only_artifact(tmp_path)
    setup = artifact["setup"]
    assert setup["rows"] == 8 and setup["horizon"] == 16 and setup["batch_size"] == 128
    assert artifact["steady_state"]["steps"] == 128 * artifact["steady_state"]["units"]
    assert {"env", "forward", "learn", "other"} <= set(artifact["time_split_seconds"])
    assert artifact["time_split_seconds"]["learn"] > 0


def test_trainer_eval_mode_counts_evaluation_time(tmp_path, capsys):
    code, out, _ = profile(tmp_path, capsys, "cartpole", "--mode", "trainer_eval", "--seconds", "0.05",
                           "--warmup", "0", "--num-envs", "8", "--set", "train.horizon=16",
                           "--eval-interval", "1", "--eval-episodes", "2", "--no-artifact",
                           "--json", tmp_path / "eval.json")
    assert code == 0, out
    artifact = json.loads((tmp_path / "eval.json").read_text())
    assert artifact["setup"]["evaluations"] >= 1 and artifact["time_split_seconds"]["eval"] > 0
    assert not (tmp_path / "artifacts").exists()


def test_trainer_unavailable_is_a_clear_error(tmp_path, capsys, monkeypatch):
    def missing():
        raise runner.TrainerUnavailable("trainer not available (No module named 'torch')")
    monkeypatch.setattr(runner, "load_trainer", missing)
    code, _, err = profile(tmp_path, capsys, "cartpole", "--mode", "trainer", "--seconds", "0.1")
    assert code == profile_cli.EXIT_TRAINER_UNAVAILABLE == 4 and "trainer not available" in err


@pytest.mark.parametrize("argv, message", [
    (["nosuchenv"], "unknown env"),
    (["cartpole", "--seconds", "0"], "--seconds"),
    (["cartpole", "--enforce-target"], "needs --target-steps-per-sec"),
    (["cartpole", "--target-steps-per-sec", "-5"], "must be positive"),
    (["cartpole", "--num-envs", "0"], "--num-envs"),
    (["cartpole", "--set", "train.horizon=8"], "do not apply to --mode env_only"),
    (["cartpole", "--mode", "trainer", "--set", "horizon"], "SECTION.KEY=VALUE"),
])
def test_bad_arguments_exit_2_with_the_reason(tmp_path, capsys, argv, message):
    code, _, err = profile(tmp_path, capsys, *argv)
    assert code == 2 and message in err
    assert not (tmp_path / "artifacts").exists()
