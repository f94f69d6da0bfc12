"""The benchmark suite as a smoke test (tiny sizes, never timed) and
benchmarks/baseline.py: the verdict rule, its refusals, and a save -> compare round
trip whose exit code follows a regression."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import baseline  # noqa: E402

sys.path.pop(0)
pytest.importorskip("pytest_benchmark")   # the `test` extra installs it
SRC = str(ROOT / "src")
TINY = dict(os.environ, PYTHONPATH=SRC, PEREGRINE_BENCH_TINY="1")


def test_the_whole_suite_runs_at_tiny_sizes_untimed():
    """Every benchmark (micro and system: native steps at 1 and all threads, the
    Multiprocessing step, a PPO update per *-fast config, cold start) runs once;
    --benchmark-disable times nothing, so speed can never fail this."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "benchmarks"), "-q", "-p", "no:cacheprovider",
         "--benchmark-disable", "-rA"], cwd=ROOT, env=TINY, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "SKIPPED" not in result.stdout, result.stdout[-2000:]
    passed = {line.split("::", 1)[1] for line in result.stdout.splitlines()
              if line.startswith("PASSED ")}
    configs = sorted(p.name[:-len("-fast.toml")]
                     for p in (ROOT / "src" / "peregrine" / "train" / "configs").glob("*-fast.toml"))
    assert configs and {f"test_ppo_update[{name}]" for name in configs} <= passed
    for name in ("test_cold_start", "test_multiprocessing_step", "test_reference_numpy_cartpole",
                 "test_env_step_cost[prospector-1]", "test_vecenv_step[1]", "test_gae_compute",
                 "test_space_flatten_peregrine", "test_policy_forward[4]", "test_buffer_add"):
        assert name in passed, sorted(passed)


# ---- the verdict rule -------------------------------------------------------------------
def test_identical_figures_are_the_same():
    assert baseline.verdict([1.0, 1.02, 1.01], [1.01, 1.0, 1.02])["verdict"] == "same"


def test_a_slowdown_beyond_threshold_and_both_spreads_is_a_regression():
    row = baseline.verdict([1.0, 1.03, 1.02], [1.5, 1.52, 1.54])
    assert row["verdict"] == "REGRESSION" and row["ratio"] == pytest.approx(1.5)
    assert row["band"] == pytest.approx(0.10)          # the threshold: both spreads smaller
    # A wider spread widens the band by the margin: 1.067 ** 1.5 - 1.
    row = baseline.verdict([1.0, 1.03, 1.05], [1.5, 1.52, 1.6])
    assert row["band"] == pytest.approx((1.6 / 1.5) ** baseline.MARGIN - 1)
    assert row["verdict"] == "REGRESSION"


def test_a_slowdown_inside_the_measured_spread_is_not_called():
    """20% slower at best, but the baseline's own sessions were 40% apart: over the
    threshold, inside the noise, so not judged (and not a regression)."""
    row = baseline.verdict([1.0, 1.4, 1.1], [1.2, 1.25, 1.3], load=3.2)
    assert row["verdict"] == "not judged (noise 40%, load 3.2)"
    assert row["band"] == pytest.approx(1.4 ** baseline.MARGIN - 1)
    # The current side's scatter counts too: every session slower, but noisy.
    assert baseline.verdict([1.0, 1.01], [1.3, 1.9])["verdict"].startswith("not judged (noise 46%")
    # A change inside the threshold stays "same", however noisy.
    assert baseline.verdict([1.0, 1.4], [1.05, 1.3])["verdict"] == "same"


def test_below_threshold_is_not_a_regression_however_steady():
    assert baseline.verdict([1.0, 1.0, 1.0], [1.08, 1.08, 1.08])["verdict"] == "same"
    assert baseline.verdict([1.0, 1.0], [1.08, 1.08], threshold=0.05)["verdict"] == "REGRESSION"


def test_faster_and_missing():
    assert baseline.verdict([1.0, 1.02], [0.5, 0.51])["verdict"] == "faster"
    assert baseline.verdict([1.0, 1.0], [])["verdict"] == "missing on current"
    assert baseline.verdict([], [1.0, 1.0])["verdict"] == "new"


def sessions(reference, **figures):
    """Benchmark sessions: every list gives one figure per session."""
    count = len(reference)
    return [{"minimum": {baseline.REFERENCE: reference[i],
                         **{name: values[i] for name, values in figures.items()}}, "failed": []}
            for i in range(count)]


def test_a_machine_that_was_slower_for_one_side_is_not_a_regression():
    """Every current session ran ~20% slow, the reference included (a busy host): times
    alone would call it; the reference's drift is allowed for, so nothing is called."""
    before = sessions([1.0, 1.02, 1.01], step=[5.0, 5.05, 5.02])
    after = sessions([1.2, 1.21, 1.22], step=[6.0, 6.1, 6.05])
    assert baseline.verdict([5.0, 5.05, 5.02], [6.0, 6.1, 6.05])["verdict"] == "REGRESSION"
    rows = {row["benchmark"]: row for row in baseline.analyse(before, after, 0.10)}
    assert rows["step"]["verdict"] == "same" and rows["step"]["drift"] == pytest.approx(1.2)
    assert rows[baseline.REFERENCE]["verdict"] == "yardstick"
    # The drift only excuses: a machine faster for the current side accuses nothing.
    rows = {row["benchmark"]: row for row in baseline.analyse(after, before, 0.10)}
    assert rows["step"]["verdict"] == "same"


def test_a_slower_benchmark_on_an_unchanged_machine_is_a_regression():
    before = sessions([1.0, 1.02, 1.01], step=[5.0, 5.05, 5.02], other=[2.0, 2.02, 2.01])
    after = sessions([1.01, 1.0, 1.02], step=[7.5, 7.6, 7.55], other=[2.01, 2.0, 2.02])
    rows = {row["benchmark"]: row for row in baseline.analyse(before, after, 0.10)}
    assert rows["step"]["verdict"] == "REGRESSION" and rows["other"]["verdict"] == "same"
    assert rows["step"]["ratio"] == pytest.approx(1.5)
    assert rows["step"]["reference_ratio"] == pytest.approx(1.5, rel=0.02)   # x ref, reported
    # A slowdown larger than the machine's drift is still called.
    slower_machine = sessions([1.1, 1.11, 1.12], step=[7.5, 7.6, 7.55], other=[2.2, 2.2, 2.2])
    rows = {row["benchmark"]: row for row in baseline.analyse(before, slower_machine, 0.10)}
    assert rows["step"]["verdict"] == "REGRESSION" and rows["other"]["verdict"] == "same"
    text = baseline.report_table(list(rows.values()))
    assert "REGRESSION (beyond +-10%)" in text and "yardstick" in text


def test_a_multi_core_benchmark_is_judged_only_when_the_cores_were_free():
    """A 2-thread step is bimodal on a shared machine (the second core free or not):
    with the load average at or above the usable cores it is reported, not judged."""
    def with_load(runs, load):
        for session in runs:
            session["cores"] = {"step2": 2, "step1": 1}
            session["load_before_1_5_15"] = session["load_after_1_5_15"] = [load, load, load]
        return runs
    figures = dict(step1=[5.0, 5.05, 5.02], step2=[2.5, 2.6, 2.55])
    slower = dict(step1=[7.5, 7.6, 7.55], step2=[5.0, 5.1, 5.05])
    for load, judged in ((4.5, False), (1.4, True)):
        before = with_load(sessions([1.0, 1.02, 1.01], **figures), load)
        after = with_load(sessions([1.0, 1.01, 1.02], **slower), load)
        rows = {row["benchmark"]: row for row in baseline.analyse(before, after, 0.10,
                                                                  usable_cores=2)}
        assert rows["step1"]["verdict"] == "REGRESSION"
        assert rows["step2"]["verdict"] == ("REGRESSION" if judged else "not judged (2 cores, load 4.5)")
    assert baseline.cores_needed({"params": {"num_threads": 2, "name": "cartpole"}}) == 2
    assert baseline.cores_needed({"params": None, "extra_info": {"cores": 2}}) == 2
    assert baseline.cores_needed({"params": None, "extra_info": {}}) == 1


def test_sessions_are_interleaved_abba():
    assert baseline.session_order(3) == ["baseline", "current", "current", "baseline",
                                         "baseline", "current"]


# ---- refusals -----------------------------------------------------------------------------
def run(store, *argv, timeout=600):
    # Not under the suite's coverage: the sessions import a worktree's copy of the
    # package (a second tree to coverage), and time, not code paths, is what they add.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "baseline.py"),
                           "--store", str(store), *argv], cwd=ROOT, env=dict(environment, PYTHONPATH=SRC),
                          capture_output=True, text=True, timeout=timeout)


def fake_baseline(store: Path, name: str, **machine) -> Path:
    sys.path.insert(0, SRC)
    try:
        from peregrine.profile.machine import machine_facts
    finally:
        sys.path.pop(0)
    path = store / "baselines" / f"{name}.json"
    path.parent.mkdir(parents=True)
    session = {"minimum": {baseline.REFERENCE: 1e-4, "test_gae_compute": 1e-4}, "failed": [],
               "load_before_1_5_15": [0.1, 0, 0], "load_after_1_5_15": [0.1, 0, 0]}
    path.write_text(json.dumps({"name": name, "saved": "now", "tiny": True, "select": None,
                                "code": {"commit": "0" * 40, "source": "HEAD"},
                                "machine": {**machine_facts(), **machine},
                                "sessions": [session, session]}))
    return path


def test_refusals_exit_2_with_the_reason(tmp_path):
    result = run(tmp_path, "compare", "nothing-here")
    assert result.returncode == 2 and "no baseline named 'nothing-here'" in result.stderr
    result = run(tmp_path, "save", "x", "--sessions", "1")
    assert result.returncode == 2 and "--sessions must be at least 2" in result.stderr
    result = run(tmp_path, "save", "../escape")
    assert result.returncode == 2 and "bad name" in result.stderr
    fake_baseline(tmp_path, "elsewhere", cpu_model="Some Other CPU", usable_cores=64)
    result = run(tmp_path, "compare", "elsewhere", "--stored", "--tiny")
    assert result.returncode == 2 and "another machine" in result.stderr
    assert "cpu_model" in result.stderr and "Some Other CPU" in result.stderr
    result = run(tmp_path, "compare", "elsewhere", "--stored")      # sizes differ
    assert result.returncode == 2 and "--tiny" in result.stderr


# ---- round trip -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)   # 8 benchmark sessions and a C build: minutes on a shared machine
def test_save_then_compare_interleaved_and_stored_exit_code_follows_a_regression(tmp_path):
    """save --rev HEAD (measured in a worktree of HEAD, its C extension built there),
    compare interleaved (no regression expected at the 10x threshold: the verdict
    machinery, not the machine, is under test), then a doctored baseline whose figure
    is 20x faster than anything measurable: --stored must call a regression, exit 1."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout (the baseline is a commit)")
    store = tmp_path / "store"
    select = ["--tiny", "-k", "test_gae_compute", "--sessions", "2"]
    try:
        saved = run(store, "save", "smoke", "--rev", "HEAD", *select)
        assert saved.returncode == 0, saved.stderr
        data = json.loads((store / "baselines" / "smoke.json").read_text())
        assert data["code"]["commit"] == subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        for session in data["sessions"]:
            assert set(session["minimum"]) == {baseline.REFERENCE, "test_gae_compute"}
            assert session["load_before_1_5_15"] is not None and "/worktrees/" in session["source"]
        assert data["machine"]["cpu_model"] and data["machine"]["torch"]

        compared = run(store, "compare", "smoke", *select, "--threshold", "10")
        assert compared.returncode == 0, compared.stdout + compared.stderr
        assert "interleaved B C C B" in compared.stdout and "verdict: no regression" in compared.stdout
        assert "x ref b -> c" in compared.stdout
        report = json.loads(next((store / "compare").glob("*-smoke.json")).read_text())
        assert [len(report["sessions"][side]) for side in ("baseline", "current")] == [2, 2]

        for session in data["sessions"]:
            session["minimum"]["test_gae_compute"] /= 20
        (store / "baselines" / "smoke.json").write_text(json.dumps(data))
        doctored = run(store, "compare", "smoke", *select, "--stored")
        assert doctored.returncode == 1, doctored.stdout + doctored.stderr
        assert "REGRESSION in 1 benchmark(s): test_gae_compute" in doctored.stdout
        assert "stored figures" in doctored.stdout
    finally:
        run(store, "clean")
