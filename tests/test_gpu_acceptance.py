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
import shutil
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
    # The summary is printed last, and the folder holds only the few files the device
    # tool brings back (at most 8).
    summary = (out / "acceptance.md").read_text()
    assert result.stdout.rstrip().endswith(summary.rstrip())
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
    solves = [run for run in runs if run["kind"] == "solve"]
    assert solves and all(run["phases"]["first_update"] > 0 for run in solves)
    startup = [run for run in runs if run["kind"] == "startup"]
    assert [run["wall_seconds"] > run["training_seconds"] > 0 for run in startup] == [True]
    peers = report["stages"]["e_peers"]["result"]
    assert {(row["mode"], row["impl"]) for row in peers["torch_cartpole_env"] +
            peers["torch_cartpole_train"]} == {("env", "torch"), ("env", "peregrine"),
                                               ("train", "torch"), ("train", "peregrine")}
    ranks = report["stages"]["f_ranks"]["result"]["rows"]
    # as many ranks as this machine has cores, up to two (bench_distributed refuses more)
    assert sorted((row["env"], row["ranks"]) for row in ranks) == [
        ("cartpole", n) for n in (1, 2) if n <= len(os.sched_getaffinity(0))]
    assert all(row["sps"] > 0 and row["efficiency"] > 0 for row in ranks)
    learning = report["stages"]["g_learning"]["result"]["runs"]
    assert [run["name"] for run in learning] == [
        plan["name"] for plan in gpu_acceptance.learning_plan(tiny=True)]
    assert learning[0]["eval"]["delivered"] >= 0 and learning[0]["steps"] >= 512
    system = report["stages"]["d_system"]["result"]
    assert system["python"] == sys.version.split()[0] and system["nvrtc"]
    # stage f's rank placement, recorded: one CPU per rank from this process's own
    # CPUs, at least one physical core, and the CPU named as /proc/cpuinfo names it
    rank_cpus = [int(cpu) for cpu in system["rank_cpus"].split(",")]
    assert sorted(rank_cpus) == sorted(os.sched_getaffinity(0))
    assert 1 <= system["physical_cores"] <= len(rank_cpus) and system["cpu_model"]
    assert "- rank_cpus: " in summary and "- physical_cores: " in summary
    for heading in ("## a: GPU tests", "## b: env-only throughput", "## c: training",
                    "## e: peer, CartPole in plain batched PyTorch", "## f: all-CPU training",
                    "## g: learning at GPU scale"):
        assert heading in summary


def test_each_part_fits_in_one_device_call():
    """One call of the device tool runs at most 600 s: each part's budgets (and g's
    deadline, for the part that has it) leave room for the copy back, and the two
    parts together are every stage."""
    budget = gpu_acceptance.BUDGET_S
    parts = gpu_acceptance.PARTS
    assert set(budget) == set(gpu_acceptance.ORDER)
    assert {*gpu_acceptance.ALWAYS, *parts["1"], *parts["2"]} == set(gpu_acceptance.ORDER)
    for stages in parts.values():
        planned = sum(budget[name] for name in (*gpu_acceptance.ALWAYS, *stages))
        assert planned <= 570, stages
    before_g = sum(budget[name] for name in (*gpu_acceptance.ALWAYS, *parts["2"])
                   if name != "g_learning")
    assert before_g + budget["g_learning"] <= gpu_acceptance.LEARNING_DEADLINE_S <= 570


def test_stages_can_be_chosen(tmp_path):
    args = gpu_acceptance.main.__globals__["argparse"].Namespace(
        out=str(tmp_path / "out"), wheels=None, device="cpu", tiny=True, dry_run=True,
        work=str(tmp_path / "work"), keep_work=True, stages=["f_ranks"])
    assert gpu_acceptance.Acceptance(args).selected == {"setup", "d_system", "f_ranks"}
    with pytest.raises(SystemExit):
        gpu_acceptance.main(["out", "--stages", "b_env_throughput,nonsense"])


def test_a_part_a_budget_and_a_deadline_reach_the_run(tmp_path, monkeypatch):
    """--part picks its stages, --budget STAGE=SECONDS replaces that stage's budget
    (and the report's sum), --deadline moves g's end; bad entries are refused."""
    seen = {}
    monkeypatch.setattr(gpu_acceptance.Acceptance, "run",
                        lambda self: seen.update(acceptance=self) or 0)
    assert gpu_acceptance.main([str(tmp_path / "out"), "--part", "2", "--budget", "f_ranks=300",
                                "--deadline", "410", "--work", str(tmp_path / "w")]) == 0
    acceptance = seen["acceptance"]
    assert acceptance.selected == {"setup", "d_system", "f_ranks", "g_learning"}
    assert acceptance.stages["f_ranks"].budget == 300
    assert acceptance.stages["c_training"].budget == gpu_acceptance.BUDGET_S["c_training"]
    assert acceptance.deadline() == 410
    for bad in (["--budget", "f_rank=30"], ["--budget", "f_ranks=-1"],
                ["--budget", "f_ranks=soon"], ["--part", "3"],
                ["--part", "1", "--stages", "a_tests"]):
        with pytest.raises(SystemExit):
            gpu_acceptance.main([str(tmp_path / "out"), *bad])


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
    assert gpu_acceptance.peer_wheels_command() in (ROOT / "README.md").read_text()
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
    """The parts only a GPU run reaches: the issues' targets judged on the measured
    rows (best against best; 'not measured' where a row is missing), utilisation per
    training run over its timed window, device-wide memory before and during."""
    report = {"stages": {
        "b_env_throughput": {"result": {"rows": [
            {"env": "cartpole", "instances": 1 << 16, "cpu": 2e9, "gpu": 3e9},
            {"env": "cartpole", "instances": 1 << 24, "cpu": 1e9, "gpu": 2e10},
            {"env": "drone_swarm", "instances": 1 << 20, "cpu": 1e8, "gpu": 1.2e9,
             "memory_before_mib": 600.0, "memory_during_mib": 2500.0}]}},
        "c_training": {"result": {"runs": [
            {"env": "cartpole", "kind": "gpu_env", "sps": 12e6},
            {"env": "cartpole", "kind": "split", "sps": 50e6},
            {"env": "drone_swarm", "kind": "gpu_env", "sps": 4e6},
            {"env": "cartpole", "kind": "solve", "candidate": "gpu", "seconds": 0.6,
             "recent_return": 480.0},
            {"env": "cartpole", "kind": "solve", "candidate": "gpu", "seconds": 0.9,
             "recent_return": 500.0},
            {"env": "cartpole", "kind": "solve", "candidate": "other", "seconds": 5.0,
             "recent_return": 500.0},
            {"name": "from process start (warm cache)", "env": "cartpole",
             "kind": "startup", "wall_seconds": 3.5}]}},
        "f_ranks": {"result": {"rows": [
            {"env": "drone_swarm", "ranks": 1, "sps": 1e5, "efficiency": 1.0},
            {"env": "drone_swarm", "ranks": 8, "independent": True, "sps": 7.8e5,
             "efficiency": 0.975},      # the machine's ceiling: neither target nor best job
            {"env": "drone_swarm", "ranks": 8, "sps": 7e5, "efficiency": 0.875}]}}}}
    found = {row["target"]: row for row in gpu_acceptance.targets(report)}
    assert found["CartPole env steps/s on the GPU"]["measured"] == 2e10
    # best against best: 2e10 / 2e9 (the C batch's best is at the smaller size)
    assert found["CartPole GPU / 16-core C batch, best vs best"]["measured"] == 10.0
    assert found["DroneSwarm GPU / C batch (agent steps), best vs best"]["met"] is True
    memory = found["DroneSwarm device memory at 1M instances, MiB (device-wide)"]
    assert (memory["measured"], memory["met"], memory["goal"]) == (2500.0, False, "<= 2,048")
    assert found["CartPole training SPS, GPU envs"]["measured"] == 12e6       # not the split
    assert found["DroneSwarm training agent SPS, GPU envs"]["met"] is False
    solve = found["CartPole --config gpu: worst seconds of training to 475"]
    assert (solve["measured"], solve["met"]) == (0.9, True)             # the candidate's worst
    assert found["CartPole --config gpu: seconds from process start (warm cache)"]["met"] is False
    assert found["DroneSwarm fast config, efficiency at 8 ranks"]["measured"] == 0.875
    assert found["DroneSwarm fast config, efficiency at 8 ranks"]["met"] is True
    assert gpu_acceptance.all_cpu_best(report, "drone_swarm")["sps"] == 7e5
    assert "| drone_swarm | 8 independent 1-rank jobs (the machine's ceiling) |" in \
        gpu_acceptance.markdown({
            "tiny": False, "device": "cuda", "started": "-", "wall_seconds": 1, "budget_s": 1,
            "stages": {"f_ranks": {**report["stages"]["f_ranks"], "status": "passed",
                                   "seconds": 1, "budget_s": 1, "notes": []}}})
    report["stages"]["c_training"]["result"]["runs"][3]["recent_return"] = 300.0
    unsolved = {row["target"]: row for row in gpu_acceptance.targets(report)}
    assert unsolved["CartPole --config gpu: worst seconds of training to 475"]["met"] is False
    assert gpu_acceptance.targets({"stages": {}})[0]["met"] is None        # nothing measured
    samples = tmp_path / "samples.csv"
    samples.write_text("2026/11/26 10:00:00.000, 10, 1000\n2026/11/26 10:00:01.000, 90, 3000\n"
                       "garbage\n2026/11/26 10:00:02.000, 50, 2000\n")
    from datetime import datetime
    second = datetime(2026, 11, 26, 10, 0, 1).timestamp()
    points = gpu_acceptance.read_samples(samples)
    usage = gpu_acceptance.gpu_usage(points, [
        {"name": "timed", "start": second - 0.9, "timed_start": second - 0.5,
         "timed_end": second + 0.5, "end": second + 1.5},
        {"name": "whole", "start": second - 0.5, "end": second + 1.5}])
    assert usage["all"] == {"samples": 3, "utilisation_mean": 50.0, "utilisation_max": 90.0,
                            "memory_used_max_mib": 3000.0}
    assert usage["timed"] == {"samples": 1, "utilisation_mean": 90.0, "utilisation_max": 90.0,
                              "memory_used_max_mib": 3000.0, "window": "timed",
                              "memory_before_mib": 1000.0}
    assert usage["whole"]["samples"] == 2 and usage["whole"]["window"] == "whole run"


H200_RUN = ROOT / "benchmarks" / "gpu_runs" / "2026-11-26-h200"


def test_the_first_h200_runs_figures_are_read_again_correctly():
    """The first H200 run's own files, read the corrected way: utilisation over each
    row's timed 4 s only (its compiled fp32 rows: CartPole 46%, DroneSwarm 65%, where
    the whole-run window with torch.compile's time read 9.6% and 16.1%), nvidia-smi's
    device-wide memory (DroneSwarm's first row jumps from 1,167 to 11,633 MiB, which
    torch's allocator reported as 818), and CartPole's GPU/C ratio best against best
    (17.6x, not the 38.2x of the C batch at its worst size)."""
    runs = json.loads((H200_RUN / "c_training.json").read_text())["runs"]
    usage = gpu_acceptance.gpu_usage(gpu_acceptance.read_samples(H200_RUN / "d_gpu_samples.csv"),
                                     runs)
    assert usage["cartpole gpu-env fp32 compiled"]["utilisation_mean"] == 46.3
    assert usage["drone_swarm gpu-env fp32 compiled"]["utilisation_mean"] == 65.2
    assert usage["cartpole gpu-env fp32 compiled"]["window"] == "timed"
    drones = usage["drone_swarm gpu-env fp32"]
    assert drones["memory_before_mib"] == 1167 and drones["memory_used_max_mib"] == 11633
    rows = json.loads((H200_RUN / "b_env_throughput.json").read_text())
    cartpole = gpu_acceptance.env_ratios(rows, "cartpole")
    assert round(cartpole["best_vs_best"], 1) == 17.6
    assert round(cartpole["matched"][1 << 24], 1) == 38.2
    assert round(gpu_acceptance.env_ratios(rows, "drone_swarm")["best_vs_best"], 2) == 8.43


def test_the_learning_plan_trains_fresh_seeds_with_a_shipped_batch_control():
    """Stage g at GPU size: every `global` and `obstacles-global` seed is a fresh one
    (never a tuning seed), in the GPU-scale shape: 8x the shipped instances and
    minibatch (so each update keeps its minibatches and epochs), `global`'s learning
    rate doubled and `obstacles-global`'s kept; one `global` run keeps the shipped
    batch and steps, so a gap to the CPU's result can be told apart from scaling."""
    from peregrine.train.config import load_config
    plan = gpu_acceptance.learning_plan(tiny=False)
    judged = [run for run in plan if "episodes" in run]
    assert {run["seed"] for run in judged} == set(gpu_acceptance.FRESH_SEEDS)
    assert not set(gpu_acceptance.FRESH_SEEDS) & {1, 2, 3, 4, 5, 401, 402, 403, 404, 405}
    controls = [run for run in judged if not run["overrides"]]
    assert [(run["variant"], run["steps"]) for run in controls] == [("global", 40_000_000)]
    assert plan[-1] is controls[0]
    assert [run["variant"] for run in plan[:5]] == ["global"] * 5
    lr_factor = {"global": 2.0, "obstacles-global": 1.0}
    for run in judged:
        if run in controls:
            continue
        shipped = load_config("drone_swarm", run["variant"])
        config = gpu_acceptance.learning_config(run, "cpu")
        assert config.vec.num_envs == 8 * shipped.vec.num_envs == 1024
        assert config.train.minibatch_size == 8 * shipped.train.minibatch_size
        assert config.train.update_epochs == shipped.train.update_epochs
        assert config.train.learning_rate == lr_factor[run["variant"]] * \
            shipped.train.learning_rate
        assert config.train.total_steps == run["steps"] == 10 ** 8
        assert config.train.seed == run["seed"] and config.vec.backend == "device"


def test_stage_g_runs_what_no_window_recorded_first(tmp_path):
    """A window starts with the runs still owed and repeats the recorded ones only
    after them; a record counts only with the run's present settings. The recorded
    windows hold `global` seeds 11-12 and `wilderness` to the end, but with no config
    fingerprint (and `global` has changed its reward since): none of them counts."""
    runs = ROOT / "benchmarks" / "gpu_runs"
    for window in ("2026-11-27-h200-full", "2026-11-28-h200"):
        (tmp_path / window).mkdir()
        shutil.copy(runs / window / "g_learning.json", tmp_path / window)
    recorded = gpu_acceptance.recorded_learning(tmp_path)
    assert recorded <= gpu_acceptance.recorded_learning()      # the shipped folder's too
    assert {("global, seed 11", None), ("global, seed 12", None),
            ("wilderness to 99% success", None)} <= recorded
    assert ("global, seed 13", None) not in recorded       # ended at the deadline
    plan = gpu_acceptance.learning_plan(tiny=False)
    names = [run["name"] for run in plan]
    assert [run["name"] for run in gpu_acceptance.unrecorded_first(plan, recorded)] == names

    # a window that recorded seed 11 and wilderness with today's settings, and seed 12
    # with another reward
    def record(run, **env):
        config = gpu_acceptance.learning_config(run, "cuda")
        config.env.update(env)
        return {"name": run["name"], "finished": True,
                "config_sha256": gpu_acceptance.config_sha256(config)}
    by_name = {run["name"]: run for run in plan}
    window = tmp_path / "2026-12-01-h100"
    window.mkdir()
    (window / "g_learning.json").write_text(json.dumps({"runs": [
        record(by_name["global, seed 11"]), record(by_name["wilderness to 99% success"]),
        record(by_name["global, seed 12"], r_time=-0.005),
        {**record(by_name["global, seed 13"]), "finished": False}]}))
    order = [run["name"] for run in gpu_acceptance.unrecorded_first(
        plan, gpu_acceptance.recorded_learning(tmp_path))]
    assert order[-2:] == ["global, seed 11", "wilderness to 99% success"]
    assert order[:-2] == [name for name in names if name not in order[-2:]]
    assert sorted(order) == sorted(names)


def test_memory_before_a_run_is_its_own_reading_where_it_took_one():
    """2026-11-28: the 250 ms sample before `cartpole C-env split 2` still held the
    previous DroneSwarm row (1,683 MiB, more than the 1,465 the row reached); the run's
    own NVML reading at its start (1,147) is what the table gives."""
    run = ROOT / "benchmarks" / "gpu_runs" / "2026-11-28-h200"
    runs = json.loads((run / "c_training.json").read_text())["runs"]
    usage = gpu_acceptance.gpu_usage(gpu_acceptance.read_samples(run / "d_gpu_samples.csv"),
                                     runs)
    split = usage["cartpole C-env split 2"]
    assert split["memory_before_mib"] == 1147 and split["memory_used_max_mib"] == 1465
    for entry in usage.values():
        if "memory_before_mib" in entry and entry["window"] == "timed":
            assert entry["memory_before_mib"] <= entry["memory_used_max_mib"]


def test_a_solve_splits_its_seconds_into_the_first_update_and_the_phases():
    # per update: (steps, seconds on the solve's clock, the record's time split)
    timings = [(4096, 0.9, {"env": 0.1, "forward": 0.2, "learn": 0.3}),
               (4096, 0.1, {"env": 0.01, "forward": 0.02, "learn": 0.05}),
               (4096, 0.1, {"env": 0.01, "forward": 0.04, "learn": 0.07})]
    phases = gpu_acceptance.solve_phases(timings, 1.2)
    # the first update is taken whole from the clock (its set-up is not in the split)
    assert phases == pytest.approx({"first_update": 0.9, "updates": 3, "rollout": 0.08,
                                    "learn": 0.12, "other": 0.1})
    assert gpu_acceptance.phase_detail(phases) == \
        "; first update 0.90 s, then per update 40 ms rollout + 60 ms learning + 50 ms other"
    assert gpu_acceptance.phase_detail(gpu_acceptance.solve_phases([], 0.0)) == ""


def test_the_solve_candidates_put_the_shipped_config_first_and_compile_last():
    """Stage c's solves: every seed of the shipped `gpu` config before any variant (a
    stage cut short keeps them); the compiled variant only in the full plan, and last
    in the stage (after the compiled throughput rows: its compilation could run long)."""
    def solves(**kwargs):
        return [(plan["candidate"], plan["overrides"]) for plan in
                gpu_acceptance.training_plan("cuda", tiny=False, **kwargs)
                if plan["kind"] == "solve"]
    full, short = solves(), solves(short=True)
    seeds = len(gpu_acceptance.SOLVE_SEEDS)
    assert [name for name, _ in full] == [name for name in gpu_acceptance.CARTPOLE_GPU_CANDIDATES
                                          for _ in range(seeds)]
    assert full[0][0] == "gpu" and full[-1][0] == "gpu, compiled"
    compiled = [name for name, overrides in full if ("train.compile", True) in overrides]
    assert compiled == ["gpu, compiled"] * seeds
    assert short == [row for row in full if row[0] != "gpu, compiled"]
    assert gpu_acceptance.training_plan("cuda", tiny=False)[-1]["candidate"] == "gpu, compiled"
    # the dry run: the shipped config on one seed
    assert [plan["candidate"] for plan in gpu_acceptance.training_plan("cpu", tiny=True)
            if plan["kind"] == "solve"] == ["gpu"]


def test_the_tree_copy_leaves_out_what_a_test_run_writes_beside_it():
    """The dry run copies the tree while other tests' subprocesses write coverage data
    files into it and remove them: a file that vanished mid-copy failed the setup."""
    import shutil
    ignore = shutil.ignore_patterns(*gpu_acceptance.COPY_IGNORE)
    names = [".coverage.vm.pid13256.Xjlm83fx", ".coverage", ".hypothesis", "src", "tests",
             "benchmarks", "pyproject.toml"]
    assert ignore(str(ROOT), names) == {".coverage.vm.pid13256.Xjlm83fx", ".coverage",
                                        ".hypothesis"}
