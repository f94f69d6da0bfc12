"""The GPU acceptance command (benchmarks/gpu_acceptance.py) kept alive without a GPU.

Its dry run (--dry-run: every stage at tiny sizes on device="cpu") runs here end to
end, through the same code the GPU run takes: the copy of the tree, the wheel
folder installed with pip --no-index --target (a small wheel made here), the C
build in the copy, the stage processes and the report. The wheel folder's checks,
the per-stage timeout and the recording of a failing stage are tested directly.
"""
import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_acceptance  # noqa: E402


def make_wheel(folder: Path, name: str, version: str = "1.0", tag: str = "py3-none-any",
               module: str | None = None) -> Path:
    """A minimal valid wheel of one module (what pip --no-index installs)."""
    module = module or name.replace("-", "_")
    distinfo = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {f"{module}/__init__.py": f"VERSION = {version!r}\n",
             f"{distinfo}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{distinfo}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                  f"Tag: {tag}\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{distinfo}/RECORD"] = "\n".join(record + [f"{distinfo}/RECORD,,"]) + "\n"
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def test_dry_run_runs_every_stage_and_writes_the_report(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "peregrine-acceptance-probe")
    out, work = tmp_path / "out", tmp_path / "work"
    # The stages import a copy of the package: a coverage run (quickstart's test command
    # measures subprocesses) must not count it as a second tree.
    environment = {k: v for k, v in os.environ.items()
                   if k != "PYTHONPATH" and not k.startswith("COVERAGE_")}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_acceptance.py"),
                             str(out), "--dry-run", "--wheels", "wheels", "--work", str(work)],
                            capture_output=True, text=True, timeout=400, env=environment,
                            cwd=tmp_path)      # a relative folder, as the device tool gives it
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The summary table is printed last, and the folder holds only the few files the
    # device tool brings back (at most 8).
    assert result.stdout.rstrip().splitlines()[-1].startswith("| drone_swarm delivers more")
    files = sorted(p.name for p in out.iterdir())
    assert set(files) <= set(gpu_acceptance.OUT_FILES) and len(files) <= 8, files
    report = json.loads((out / "acceptance.json").read_text())
    assert report["tiny"] and report["device"] == "cpu"
    assert [report["stages"][name]["status"] for name in gpu_acceptance.ORDER] == \
        ["passed"] * len(gpu_acceptance.ORDER)
    setup = report["stages"]["setup"]["result"]
    assert setup["wheels"] == ["peregrine_acceptance_probe-1.0-py3-none-any.whl"]
    assert (work / "site" / "peregrine_acceptance_probe" / "__init__.py").exists()
    assert list((work / "tree" / "src" / "peregrine" / "envs" / "cartpole").glob("_cartpole*.so"))
    assert not (work / "tree" / ".git").exists()
    tests = report["stages"]["a_tests"]["result"]
    assert tests["passed"] >= 10 and not tests.get("failed") and not tests["failures"]
    rows = report["stages"]["b_env_throughput"]["result"]["rows"]
    assert sorted(row["env"] for row in rows) == sorted(
        ["cartpole", "pendulum", "mountain_car", "mountain_car_continuous", "prospector",
         "drone_swarm"])
    assert all(row["cpu"] > 0 and row["gpu"] > 0 for row in rows)
    runs = report["stages"]["c_training"]["result"]["runs"]
    assert [run["name"] for run in runs] == [
        plan["name"] for plan in gpu_acceptance.training_plan("cpu", tiny=True)]
    assert not [run for run in runs if run.get("error")]
    assert all(run["sps"] > 0 for run in runs if run["kind"] in ("gpu_env", "split", "cpu"))
    system = report["stages"]["d_system"]["result"]
    assert system["python"] == sys.version.split()[0] and system["nvrtc"]
    summary = (out / "acceptance.md").read_text()
    for heading in ("## a: GPU tests", "## b: env-only throughput", "## c: training"):
        assert heading in summary


def test_the_stage_budgets_fit_in_eight_minutes():
    assert sum(gpu_acceptance.BUDGET_S.values()) <= 8 * 60
    assert set(gpu_acceptance.BUDGET_S) == set(gpu_acceptance.ORDER)


def test_wheel_folder_checks_name_what_pip_would_trip_on(tmp_path):
    good = make_wheel(tmp_path, "farama-notifications", "0.0.6")
    assert gpu_acceptance.wheel_folder(tmp_path) == {"farama-notifications": good}
    make_wheel(tmp_path, "farama-notifications", "0.0.4")
    with pytest.raises(ValueError, match="two wheels of farama-notifications"):
        gpu_acceptance.wheel_folder(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    make_wheel(other, "fastthing", tag="cp39-cp39-win_amd64")
    with pytest.raises(ValueError, match="fastthing-1.0-cp39-cp39-win_amd64.whl is not for "
                                         "this Python"):
        gpu_acceptance.wheel_folder(other)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="notes.txt is not a wheel"):
        gpu_acceptance.wheel_folder(junk)
    with pytest.raises(ValueError, match="no such folder.*pip download"):
        gpu_acceptance.wheel_folder(tmp_path / "absent")


def test_missing_distributions_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_acceptance, "WHEELS", {"gymnasium": "1.4.0",
                                                    "peregrine-not-installed": "1.0"})
    assert gpu_acceptance.missing_distributions({}, dict(os.environ)) == \
        ["peregrine-not-installed"]
    wheel = make_wheel(tmp_path, "peregrine-not-installed")
    assert gpu_acceptance.missing_distributions(
        {"peregrine-not-installed": wheel}, dict(os.environ)) == []
    assert gpu_acceptance.top_level(wheel) == {"peregrine_not_installed"}


def test_the_download_command_is_the_one_documented():
    command = gpu_acceptance.download_command()
    assert "--python-version 3.12" in command and "-d .gpu-wheels" in command
    for name, version in gpu_acceptance.WHEELS.items():
        assert f"{name}=={version}" in command
    assert command in (ROOT / "README.md").read_text()
    assert "/.gpu-wheels/" in (ROOT / ".gitignore").read_text().split()


def test_a_hung_stage_is_killed_with_its_children_at_its_budget(tmp_path):
    marker = tmp_path / "child-alive"
    grandchild = tmp_path / "grandchild.py"
    grandchild.write_text(f"import pathlib, time\ntime.sleep(3)\n"
                          f"pathlib.Path({str(marker)!r}).touch()\n")
    stage = tmp_path / "stage.py"
    stage.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, "
                     f"{str(grandchild)!r}])\ntime.sleep(60)\n")
    started = time.monotonic()
    status, code = gpu_acceptance.run_process([sys.executable, str(stage)],
                                              tmp_path / "log", 1.0, dict(os.environ), tmp_path)
    assert (status, code) == ("timed out", -9)
    assert time.monotonic() - started < 10
    time.sleep(3.5)
    assert not marker.exists()                 # the grandchild went with the group
    assert "killed after 1 s" in (tmp_path / "log").read_text()


def test_a_failing_stage_is_recorded_and_the_next_ones_still_run(tmp_path, monkeypatch):
    args = gpu_acceptance.main.__globals__["argparse"].Namespace(
        out=str(tmp_path / "out"), wheels=None, device="cpu", tiny=True, dry_run=True,
        work=str(tmp_path / "work"), keep_work=True)
    acceptance = gpu_acceptance.Acceptance(args)
    ran = []

    def passing(stage):
        ran.append(stage.name)
        stage.status = "passed"

    def crashing(stage):
        ran.append(stage.name)
        raise RuntimeError("the GPU fell over")

    for name in gpu_acceptance.ORDER:
        monkeypatch.setattr(acceptance, name, passing)
    monkeypatch.setattr(acceptance, "a_tests", crashing)
    assert acceptance.run() == 1
    assert ran == list(gpu_acceptance.ORDER)
    report = json.loads((tmp_path / "out" / "acceptance.json").read_text())
    assert report["stages"]["a_tests"]["status"] == "error"
    assert report["stages"]["a_tests"]["notes"] == ["RuntimeError: the GPU fell over"]
    assert report["stages"]["c_training"]["status"] == "passed"
    assert "| a_tests | error |" in (tmp_path / "out" / "acceptance.md").read_text()


def test_targets_and_gpu_samples_are_read_from_what_was_measured(tmp_path):
    """The parts only a GPU run reaches: the issue's targets judged on the measured
    rows (and 'not measured' where a row is missing), utilisation per training run."""
    report = {"stages": {
        "b_env_throughput": {"result": {"rows": [
            {"env": "cartpole", "instances": 1 << 20, "cpu": 1e9, "gpu": 5e9},
            {"env": "cartpole", "instances": 1 << 24, "cpu": 1e9, "gpu": 2e10}]}},
        "c_training": {"result": {"runs": [
            {"env": "cartpole", "kind": "gpu_env", "sps": 12e6},
            {"env": "cartpole", "kind": "split", "sps": 50e6},
            {"env": "drone_swarm", "kind": "gpu_env", "sps": 4e6}]}}}}
    found = {row["target"]: row for row in gpu_acceptance.targets(report)}
    assert found["CartPole env steps/s on the GPU"]["measured"] == 2e10
    assert found["CartPole GPU / 16-core C batch"]["met"] is True
    assert found["DroneSwarm GPU / C batch (agent steps)"]["met"] is None     # not measured
    assert found["CartPole training SPS, GPU envs"]["measured"] == 12e6       # not the split
    assert found["DroneSwarm training agent SPS, GPU envs"]["met"] is False
    samples = tmp_path / "samples.csv"
    samples.write_text("2026/11/26 10:00:00.000, 10, 1000\n2026/11/26 10:00:01.000, 90, 3000\n"
                       "garbage\n2026/11/26 10:00:02.000, 50, 2000\n")
    from datetime import datetime
    second = datetime(2026, 11, 26, 10, 0, 1).timestamp()
    usage = gpu_acceptance.gpu_utilisation(samples, [{"name": "run", "start": second - 0.5,
                                                       "end": second + 0.5}])
    assert usage["all"] == {"samples": 3, "utilisation_mean": 50.0, "utilisation_max": 90.0,
                            "memory_used_max_mib": 3000.0}
    assert usage["run"]["samples"] == 1 and usage["run"]["utilisation_mean"] == 90.0
