"""benchmarks/baseline.py's verdict against its own measured noise, on synthetic
pytest-benchmark JSON: a slowdown that the comparison's noise (session spread, round
inflation, machine load) could make of identical code is `not judged` and exits 0; a
slowdown with tight figures on both sides is a REGRESSION and exits 1."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import baseline  # noqa: E402

sys.path.pop(0)

PPO = "test_ppo_update[mountain_car]"      # 3 rounds of ~70 ms a session: long rounds
STEP = "test_env_step_cost[cartpole-1]"   # microseconds, hundreds of rounds: short rounds


def benchmark_json(figures: dict) -> dict:
    """A pytest-benchmark JSON document: `figures` maps a name to (best, median, rounds)."""
    entries = [{"name": baseline.REFERENCE, "group": "reference", "params": None,
                "extra_info": {"reference_source_sha256": "f" * 64},
                "stats": {"min": 100e-6, "median": 104e-6, "rounds": 2000}}]
    for name, (best, median, rounds) in figures.items():
        entries.append({"name": name, "group": None, "params": None, "extra_info": {},
                        "stats": {"min": best, "median": median, "rounds": rounds}})
    return {"machine_info": {}, "benchmarks": entries}


def session(load: float, **figures) -> dict:
    """A recorded session (as run_session keeps it) with the 1-minute load `load`."""
    return {"load_before_1_5_15": [load] * 3, "load_after_1_5_15": [load] * 3, "failed": [],
            **baseline.session_figures(benchmark_json(figures))}


def ppo(best: float, inflation: float = 0.3) -> tuple:
    return best, best * (1 + inflation), 3


def step(best: float) -> tuple:
    return best, best * 1.05, 900


def rows_of(before, after, usable_cores=2) -> dict:
    return {row["benchmark"]: row
            for row in baseline.analyse(before, after, 0.10, usable_cores=usable_cores)}


def sides(load_b, load_c, ppo_b, ppo_c, step_b, step_c, inflation=0.3):
    """Three sessions a side of the PPO update and an env step."""
    before = [session(load_b, **{PPO: ppo(x, inflation), STEP: step(y)})
              for x, y in zip(ppo_b, step_b)]
    after = [session(load_c, **{PPO: ppo(x, inflation), STEP: step(y)})
             for x, y in zip(ppo_c, step_c)]
    return before, after


# The figures of the false alarm in issue 36: HEAD against itself at load ~4.6 on 2 cores,
# ppo_update[mountain_car] 2.29x slower, each side's session minima close together.
WOLF_PPO = ([0.067, 0.070, 0.071], [0.1535, 0.156, 0.160])
STEADY_STEP = ([2.50e-6, 2.52e-6, 2.51e-6], [2.51e-6, 2.50e-6, 2.53e-6])


def test_session_figures_keep_best_median_and_rounds_from_pytest_benchmark_json():
    data = benchmark_json({PPO: (0.07, 0.09, 3)})
    data["benchmarks"][1]["params"] = {"num_threads": 2}
    figures = baseline.session_figures(data)
    assert figures["minimum"][PPO] == 0.07 and figures["median"][PPO] == 0.09
    assert figures["rounds"][PPO] == 3 and figures["cores"][PPO] == 2
    assert figures["reference_source_sha256"] == "f" * 64


def test_the_self_comparison_that_cried_wolf_is_not_judged():
    """Spreads alone (3-6%) would call the 2.29x a regression; the long rounds' load
    excess (4.6 / 2 - 1 = 130%) and round inflation (30%) say other jobs could have made
    it, so it is not judged, with the noise and load in the verdict."""
    before, after = sides(4.6, 4.6, *WOLF_PPO, *STEADY_STEP)
    spread_only = baseline.verdict(*WOLF_PPO)
    assert spread_only["verdict"] == "REGRESSION"           # what the old rule said
    rows = rows_of(before, after)
    assert rows[PPO]["ratio"] == pytest.approx(0.1535 / 0.067)
    assert rows[PPO]["verdict"] == "not judged (noise 130%, load 4.6)"
    assert rows[PPO]["noise"] == pytest.approx(1.3)
    assert rows[STEP]["verdict"] == "same"
    assert not [r for r in rows.values() if r["verdict"] == "REGRESSION"]


def test_round_inflation_alone_keeps_a_lucky_minimum_from_being_called():
    """Quiet machine (load 0.5), but each session's median round sat 150% above its best:
    the best was a lucky draw, a 2.29x gap between the sides is inside that."""
    before, after = sides(0.5, 0.5, *WOLF_PPO, *STEADY_STEP, inflation=1.5)
    assert rows_of(before, after)[PPO]["verdict"] == "not judged (noise 150%, load 0.5)"


def test_a_real_2x_slowdown_with_tight_figures_is_still_a_regression():
    """Quiet machine, rounds within 2% of their best, session minima within 2%:
    a 2x slower PPO update and a 2x slower env step are both called."""
    before, after = sides(0.5, 0.6, [0.067, 0.068, 0.0675], [0.134, 0.135, 0.1345],
                          [2.50e-6, 2.52e-6, 2.51e-6], [5.0e-6, 5.05e-6, 5.02e-6],
                          inflation=0.02)
    rows = rows_of(before, after)
    assert rows[PPO]["verdict"] == "REGRESSION" and rows[STEP]["verdict"] == "REGRESSION"
    assert rows[PPO]["band"] == pytest.approx(0.10)


def test_load_does_not_excuse_a_short_round_benchmark():
    """Microsecond rounds dodge other jobs (the minimum of hundreds of rounds is the
    uncontended cost), so a 2x slower env step is called even at load 4.6 on 2 cores,
    while the long-round PPO update beside it, unchanged, is `same`."""
    before, after = sides(4.6, 4.6, [0.067, 0.068, 0.0675], [0.068, 0.067, 0.069],
                          [2.50e-6, 2.52e-6, 2.51e-6], [5.0e-6, 5.05e-6, 5.02e-6])
    rows = rows_of(before, after)
    assert rows[STEP]["verdict"] == "REGRESSION" and rows[STEP]["noise"] < 0.02
    assert rows[PPO]["verdict"] == "same"


def test_a_slowdown_beyond_even_the_load_is_a_regression():
    """At load 3 on 2 cores (load excess 50%, band 1.5 ** 1.5 - 1 = 84%) a 3x slower
    PPO update is still called."""
    before, after = sides(3.0, 3.0, [0.067, 0.068, 0.0675], [0.201, 0.203, 0.202],
                          *STEADY_STEP, inflation=0.05)
    row = rows_of(before, after)[PPO]
    assert row["band"] == pytest.approx(1.5 ** baseline.MARGIN - 1)
    assert row["verdict"] == "REGRESSION"


def test_the_margin_keeps_a_gap_the_size_of_the_spread_from_being_called():
    """Sessions 20% apart on a side; the other side 25% slower at best: more than the
    spread, less than 1.2 ** 1.5 - 1 = 31%, so not judged; 40% slower is called."""
    assert baseline.verdict([1.0, 1.2, 1.1], [1.25, 1.3, 1.28])["verdict"].startswith(
        "not judged (noise 20%")
    assert baseline.verdict([1.0, 1.2, 1.1], [1.4, 1.45, 1.42])["verdict"] == "REGRESSION"


def test_helpers():
    assert baseline.inflation([1.0, 2.0, 1.0], [1.5, 2.2, 1.2]) == pytest.approx(0.2)
    assert baseline.inflation([], []) != baseline.inflation([], [])       # NaN
    assert baseline.load_excess(4.6, 2) == pytest.approx(1.3)
    assert baseline.load_excess(1.0, 2) == 0.0
    assert baseline.noise([1.0, 1.1], [1.0, 1.0], (0.3, float("nan"))) == pytest.approx(0.3)
    assert baseline.noise([1.0], [1.0]) == 0.0


# ---- the exit code of a whole compare, sessions replaced by recorded figures ------------
def compare_exit(tmp_path, monkeypatch, before, after) -> tuple[int, str]:
    """`baseline.py compare` with run_session returning the given sessions in ABBA order."""
    facts = {"cpu_model": "Test CPU", "logical_cores": 2, "usable_cores": 2,
             "architecture": "x86_64", "hostname": "test", "python": "3", "numpy": "2",
             "torch": "2", "gymnasium": "1"}
    store = tmp_path / "store"
    path = baseline.baseline_path(store, "main")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "main", "saved": "now", "tiny": False, "select": None,
                                "code": {"commit": "0" * 40, "source": "HEAD"},
                                "machine": facts, "sessions": before}))
    queues = {"baseline": list(before), "current": list(after)}
    monkeypatch.setattr(baseline, "_machine_facts", lambda: dict(facts))
    monkeypatch.setattr(baseline, "worktree_source", lambda store, commit: tmp_path / "src")
    monkeypatch.setattr(baseline, "run_session", lambda source, output, *rest: queues[
        "baseline" if source == tmp_path / "src" else "current"].pop(0))
    return baseline.main(["--store", str(store), "compare", "main"]), str(path)


def test_compare_exits_0_on_the_wolf_and_1_on_a_real_regression(tmp_path, monkeypatch, capsys):
    before, after = sides(4.6, 4.6, *WOLF_PPO, *STEADY_STEP)
    code, _ = compare_exit(tmp_path / "wolf", monkeypatch, before, after)
    out = capsys.readouterr().out
    assert code == baseline.EXIT_OK, out
    assert "not judged (noise 130%, load 4.6)" in out and "verdict: no regression" in out
    assert "inside this run's measured noise are not judged" in out

    before, after = sides(0.5, 0.5, [0.067, 0.068, 0.0675], [0.134, 0.135, 0.1345],
                          *STEADY_STEP, inflation=0.02)
    code, _ = compare_exit(tmp_path / "real", monkeypatch, before, after)
    out = capsys.readouterr().out
    assert code == baseline.EXIT_REGRESSION, out
    assert f"REGRESSION in 1 benchmark(s): {PPO}" in out
