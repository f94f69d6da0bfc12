"""Saved benchmark baselines and regression verdicts that respect a noisy machine.

    python benchmarks/baseline.py save main              # name the code as it is now
    python benchmarks/baseline.py compare main           # exit 1 on a regression
    python benchmarks/baseline.py list

The suite is pytest-benchmark's (benchmarks/test_bench_*.py). One *session*
is one `pytest benchmarks/ --benchmark-only --benchmark-json=...` process run
with one tree's `src/` first on PYTHONPATH; the benchmark files are always
the working tree's, so both sides of a comparison measure the same thing.

`save NAME` records which code the baseline is (a commit: HEAD, or with
uncommitted changes to tracked files a `git stash create` snapshot of them,
kept alive by the ref refs/peregrine-bench/NAME; `--rev` names another
commit), runs `--sessions` sessions of it, and writes
.benchmarks/baselines/NAME.json: the commit, the machine (CPU model, cores,
library versions, load average before and after every session) and every
session's figures.

`compare NAME` checks the baseline's code out into a git worktree
(.benchmarks/worktrees/<commit>, its C extension built once), then runs
sessions of the baseline and of the working tree alternately, in ABBA order
(B C, C B, B C, ...), so load from other jobs and slow drifts of the machine
hit both sides alike. It prints, per benchmark, both sides' best time, their
ratio, each side's spread, each side as a multiple of the reference measured
in the same session (one step of the NumPy CartPole, test_bench_system.py)
and a verdict; it writes the whole report to .benchmarks/compare/. Exit
codes: 0 no regression, 1 a regression (or a benchmark that ran on the
baseline fails on the working tree), 2 refused (unknown baseline, different
machine, different sizes), 3 a session could not run.

The verdict, per benchmark (`verdict()`): each session gives the benchmark's
best (minimum) time per call and its median round; over the sessions,
`best_X` is the minimum of one side's session minima. The reference (one
step of the NumPy CartPole, measured in every session, not judged) gives the
machine's drift between the sides, `drift = best_current / best_baseline` of
the reference. The noise of the comparison is measured from the sessions
themselves, per benchmark (`noise()`):

    spread_X    = max / min - 1 of side X's session minima
    noise       = max(spread_baseline, spread_current)
    for a benchmark with long rounds (median round >= 5 ms, LONG_ROUND), also
                  max(inflation_baseline, inflation_current, load excess)
      inflation_X = median over X's sessions of (median round / best round - 1)
      load excess = peak 1-minute load average / usable cores - 1 (0 if below)

and with `margin` = 1.5 (MARGIN):

    band     = max(threshold, (1 + noise) ** margin - 1)
    slowdown = ratio / max(1, drift),  ratio = best_current / best_baseline
    REGRESSION                         if slowdown - 1 > band
    not judged (noise N, load L)       if threshold < slowdown - 1 <= band
    faster                             if min(1, drift) / ratio - 1 > band
    same                               otherwise

Why this statistic: on a shared machine noise only ever adds time, so the
minimum is the steadiest estimate of what the code costs (min-of-N); the
spread of one code's session minima is this machine's noise measured during
this very comparison. A slowdown is called only when it clears that noise by
the margin: the spread of one side's three session minima is the range of
three draws, about 1.7 standard deviations of a normal scatter on average,
while six draws of identical code (both sides together) range over about 2.5,
half as much again: so a gap up to 1.5x one side's measured spread (compared
on a log scale, hence the power) is what identical code is expected to show.
`--threshold` (default 10%) is the smallest change worth failing a build
for, and absorbs code-layout effects that separate builds of the same
source can show.

Long rounds (a PPO update, the cold start: 3 rounds of 60 ms to seconds a
session) need the two further terms. A round much shorter than a scheduler slice
(microseconds, hundreds of rounds a session) often runs untouched, so its
minimum is the uncontended cost whatever the load, and the session spread
measures how well; a round of many slices is shared with other jobs in every
round, so its minimum carries the load of its moment. Then (1) a session
whose typical round took far longer than its best shows that its best was a
lucky draw that the next session need not repeat (the inflation), and (2)
with the load average at L on C usable cores a CPU-bound process gets about
C / L of a core, so other jobs alone can stretch such a round by L / C (the
load excess): a self-comparison on 2 shared cores at load ~4.6 once put
`ppo_update[mountain_car]` at 2.29x with both sides' spreads inside that.
A slowdown over the threshold that the band cannot exclude is `not judged`
with its noise and load printed: not a regression (exit 0), and not `same`
either (rerun on a quieter machine, or with more sessions, to judge it). A
noisy machine only widens the band; it never makes a verdict up.

The drift allowance is there because under heavy load (load average ~10 on 2
cores) a whole session can run slow, its minimum included: in a
self-comparison on such a machine the reference itself came out 12% slower
for one side. The reference can only excuse a slowdown (drift > 1) or a
speed-up (drift < 1), never create one. The "x ref" columns divide each
session's figure by that session's reference; they are reported, not voted
on: per session the reference's own noise adds to every figure's
(benchmarks/RESULTS.md shows a deliberate 22% slowdown that they hid). A benchmark that keeps
several cores busy (a step at 2 threads, the Multiprocessing step) is judged
only when the 1-minute load average stayed below the usable cores during the
whole comparison: on a shared machine such a figure is bimodal (a 2-thread
Prospector step took 46 us in sessions that found the second core free, 91 us
in the others), and in the fourth self-comparison of the final series all
three baseline sessions found it free and all three current sessions did not,
which the spread cannot see. Its row then says `not judged (N cores, load L)`.

`compare --stored` skips the worktree and compares the working tree's
sessions with the figures saved in the baseline, each divided by its own
session's reference (the machine's speed then cancels to first order); it
refuses a baseline saved on another machine (CPU model, core count,
architecture) unless --allow-cross-machine, and flags different library
versions. Prefer the interleaved default: it is the one whose verdicts the
ten-in-a-row self-comparison in benchmarks/RESULTS.md was measured with.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
REFERENCE = "test_reference_numpy_cartpole"
# What makes two machines "the same" for a comparison of stored figures.
MACHINE_KEYS = ("cpu_model", "logical_cores", "usable_cores", "architecture")
LIBRARY_KEYS = ("python", "numpy", "torch", "gymnasium")
DEFAULT_THRESHOLD = 0.10
# A slowdown must clear the measured noise by this power of (1 + noise) (module docstring).
MARGIN = 1.5
# Rounds at least this long (seconds) span several scheduler slices: other jobs share
# every one of them, so round inflation and load count as noise (module docstring).
LONG_ROUND = 5e-3
DEFAULT_SESSIONS = 3
EXIT_OK, EXIT_REGRESSION, EXIT_REFUSED, EXIT_SESSION_FAILED = 0, 1, 2, 3
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Refused(Exception):
    """A comparison that would not mean anything (exit 2)."""


class SessionFailed(Exception):
    """A benchmark session did not produce results (exit 3)."""


# ---- the verdict --------------------------------------------------------------------
def spread(values) -> float:
    """max / min - 1 of a side's session minima (NaN for fewer than two)."""
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return max(values) / min(values) - 1 if len(values) >= 2 else math.nan


def inflation(minima, medians) -> float:
    """Median over sessions of (median round / best round - 1): how far a typical
    round sat above the session's best (NaN without figures)."""
    values = sorted(med / low - 1 for low, med in zip(minima, medians)
                    if low > 0 and math.isfinite(low) and math.isfinite(med) and med >= low)
    if not values:
        return math.nan
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def load_excess(load: float, usable_cores: int | None) -> float:
    """How much other jobs could stretch a long CPU-bound round: load / cores - 1, at least 0
    (NaN when either is unknown)."""
    if not usable_cores or not math.isfinite(load):
        return math.nan
    return max(0.0, load / usable_cores - 1)


def noise(baseline, current, extra=()) -> float:
    """The comparison's measured noise: the larger side spread of session minima and any
    `extra` terms (a long-round benchmark's inflation and load excess); NaN-free, >= 0."""
    terms = [t for t in (spread(baseline), spread(current), *extra) if t == t]
    return max([0.0, *terms])


def verdict(baseline, current, threshold: float = DEFAULT_THRESHOLD, drift: float = 1.0,
            extra_noise=(), load: float = math.nan) -> dict:
    """The verdict for one benchmark from each side's per-session minimum times
    (seconds per call, or any figure where smaller is better); `drift` is the
    reference's best_current / best_baseline (the machine's change between the sides);
    `extra_noise`: further measured noise terms (see the module docstring); `load`: the
    peak load average, only printed in a `not judged` verdict."""
    baseline = [v for v in baseline if v > 0 and math.isfinite(v)]
    current = [v for v in current if v > 0 and math.isfinite(v)]
    if not baseline or not current:
        return {"verdict": "missing on current" if baseline else "new", "ratio": math.nan,
                "band": math.nan, "noise": math.nan, "spread_baseline": spread(baseline),
                "spread_current": spread(current)}
    ratio = min(current) / min(baseline)
    measured = noise(baseline, current, extra_noise)
    band = max(threshold, (1 + measured) ** MARGIN - 1)
    drift = drift if drift > 0 and math.isfinite(drift) else 1.0
    slowdown = ratio / max(1.0, drift) - 1
    if slowdown > band:
        outcome = "REGRESSION"
    elif slowdown > threshold:
        # Slower by more than is worth failing for, but inside what this run's own noise
        # could make of identical code: neither a regression nor "same".
        load_text = f"{load:.1f}" if load == load else "unknown"
        outcome = f"not judged (noise {measured:.0%}, load {load_text})"
    elif min(1.0, drift) / ratio - 1 > band:
        outcome = "faster"
    else:
        outcome = "same"
    return {"verdict": outcome, "ratio": ratio, "band": band, "noise": measured, "drift": drift,
            "spread_baseline": spread(baseline), "spread_current": spread(current)}


def session_order(sessions: int) -> list[str]:
    """ABBA interleaving: baseline, current, current, baseline, baseline, ..."""
    order = []
    for index in range(sessions):
        order += ["baseline", "current"] if index % 2 == 0 else ["current", "baseline"]
    return order


# ---- machines -------------------------------------------------------------------------
def _machine_facts() -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    try:
        from peregrine.profile.machine import machine_facts
    finally:
        sys.path.pop(0)
    return machine_facts()


def machine_differences(saved: dict, now: dict, keys) -> list[str]:
    return [f"{key}: {saved.get(key)!r} then, {now.get(key)!r} now"
            for key in keys if saved.get(key) != now.get(key)]


# ---- git --------------------------------------------------------------------------------
def git(*args, cwd=ROOT) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise Refused(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def snapshot_code(name: str, rev: str | None) -> dict:
    """The commit that holds the code of baseline `name`."""
    if rev is not None:
        return {"commit": git("rev-parse", "--verify", f"{rev}^{{commit}}"), "source": rev,
                "working_tree": False}
    commit = git("rev-parse", "HEAD")
    snapshot = git("stash", "create")   # a commit of the tracked changes; '' when clean
    untracked = [line[3:] for line in git("status", "--porcelain", "--", "src").splitlines()
                 if line.startswith("??")]
    if untracked:
        print(f"warning: untracked files under src/ are not part of the baseline's commit "
              f"(only of this save's figures): {', '.join(untracked)}", file=sys.stderr)
    if snapshot:
        git("update-ref", f"refs/peregrine-bench/{name}", snapshot)
        return {"commit": snapshot, "source": f"uncommitted changes on {commit[:12]}",
                "working_tree": True}
    return {"commit": commit, "source": "HEAD", "working_tree": True}


def worktree_source(store: Path, commit: str) -> Path:
    """`src/` of a worktree of `commit` with its C extension built (kept for reuse)."""
    path = store / "worktrees" / commit[:16]
    if not (path / ".git").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", "--force", str(path), commit)
    stamp = path / ".peregrine-bench-built"
    if not stamp.exists():
        print(f"building the C extension of {commit[:12]} in {path} ...", file=sys.stderr)
        # (setup.py compiles the env modules in parallel)
        build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                               cwd=path, capture_output=True, text=True)
        if build.returncode != 0:
            raise SessionFailed(f"building {commit[:12]} failed:\n{build.stderr[-4000:]}")
        stamp.write_text(commit + "\n")
    return path / "src"


# ---- sessions -----------------------------------------------------------------------
def _load():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def run_session(source: Path, output: Path, select: str | None, tiny: bool,
                max_time: float) -> dict:
    """One pytest-benchmark process measuring the code in `source`; its figures."""
    # pytest-benchmark is the one plugin a session loads: the others installed (hypothesis,
    # xdist, cov...) cost seconds of start-up a session and measure nothing here
    command = [sys.executable, "-m", "pytest", str(BENCH_DIR), "-q", "-p", "no:cacheprovider",
               "-p", "pytest_benchmark.plugin", "--benchmark-only",
               f"--benchmark-json={output}", f"--benchmark-max-time={max_time}",
               "--benchmark-min-rounds=5", "--benchmark-disable-gc", "-W", "ignore"]
    if select:
        command += ["-k", f"({select}) or {REFERENCE}"]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(source), *filter(None, [os.environ.get("PYTHONPATH")])]))
    environment.pop("PEREGRINE_BENCH_TINY", None)
    environment["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    # a session is a pytest run of its own: started from inside a pytest-xdist worker
    # (the suite runs that way), the inherited worker id would make pytest-benchmark
    # disable itself
    for key in [key for key in environment if key.startswith("PYTEST_XDIST_")]:
        del environment[key]
    if tiny:
        environment["PEREGRINE_BENCH_TINY"] = "1"
    output.parent.mkdir(parents=True, exist_ok=True)
    load_before, start = _load(), time.time()
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    load_after = _load()
    if result.returncode not in (0, 1) or not output.is_file():
        raise SessionFailed(f"benchmark session for {source} exited {result.returncode}:\n"
                            f"{(result.stdout + result.stderr)[-4000:]}")
    data = json.loads(output.read_text())
    measured = data["machine_info"].get("peregrine", {}).get("source", "")
    if Path(measured).resolve() != (source / "peregrine").resolve():
        raise SessionFailed(f"the session measured {measured}, not {source / 'peregrine'} "
                            "(is PYTHONPATH overridden by an installed copy?)")
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) \S+::(\S+)", result.stdout, re.M)))
    return {
        "source": str(source), "started": start, "seconds": time.time() - start,
        "load_before_1_5_15": load_before, "load_after_1_5_15": load_after,
        "failed": failed,
        **session_figures(data),
    }


def session_figures(data: dict) -> dict:
    """What a session keeps of a pytest-benchmark JSON file: per benchmark its best and
    median round (seconds per call), round count, group and cores kept busy."""
    benchmarks = data["benchmarks"]
    return {
        "reference_source_sha256": next(
            (b["extra_info"].get("reference_source_sha256") for b in benchmarks
             if b["name"] == REFERENCE), None),
        "minimum": {b["name"]: b["stats"]["min"] for b in benchmarks},
        "median": {b["name"]: b["stats"]["median"] for b in benchmarks},
        "rounds": {b["name"]: b["stats"]["rounds"] for b in benchmarks},
        "group": {b["name"]: b["group"] for b in benchmarks},
        "cores": {b["name"]: cores_needed(b) for b in benchmarks},
    }


def cores_needed(benchmark: dict) -> int:
    """Cores a pytest-benchmark entry keeps busy at once: its `num_threads` parameter,
    or `cores` in its extra_info (the Multiprocessing step's workers); else 1."""
    params = benchmark.get("params") or {}
    return int(benchmark.get("extra_info", {}).get("cores") or params.get("num_threads") or 1)


def normalized(session: dict) -> dict:
    """Each benchmark's minimum as a multiple of the session's reference minimum."""
    reference = session["minimum"].get(REFERENCE)
    if not reference:
        return {}
    return {name: value / reference for name, value in session["minimum"].items()}


# ---- storage --------------------------------------------------------------------------
def baseline_path(store: Path, name: str) -> Path:
    return store / "baselines" / f"{name}.json"


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(temporary, path)


def stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


# ---- commands -------------------------------------------------------------------------
def command_save(args) -> int:
    store = Path(args.store)
    code = snapshot_code(args.name, args.rev)
    source = ROOT / "src" if code["working_tree"] else worktree_source(store, code["commit"])
    machine = _machine_facts()
    sessions = []
    scratch = store / "sessions" / f"{stamp()}-save-{args.name}"
    for index in range(args.sessions):
        print(f"session {index + 1}/{args.sessions} ...", file=sys.stderr, flush=True)
        sessions.append(run_session(source, scratch / f"{index}.json", args.select, args.tiny,
                                    args.max_time))
    baseline = {"schema": "peregrine.bench-baseline/1", "name": args.name, "saved": stamp(),
                "code": code, "machine": machine, "tiny": args.tiny, "select": args.select,
                "sessions": sessions}
    path = baseline_path(store, args.name)
    write_json(path, baseline)
    print(f"saved baseline {args.name!r}: {code['commit'][:12]} ({code['source']}), "
          f"{len(sessions)} sessions, {len(sessions[0]['minimum'])} benchmarks -> {path}")
    return EXIT_OK


def _format_seconds(value: float) -> str:
    if value != value:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def peak_load(sessions) -> float:
    """The highest 1-minute load average seen before or after any of `sessions`."""
    values = [s[key][0] for s in sessions for key in ("load_before_1_5_15", "load_after_1_5_15")
              if s.get(key)]
    return max(values) if values else math.nan


def long_round_noise(name, baseline_sessions, current_sessions, load,
                     usable_cores) -> tuple[float, ...]:
    """The extra noise terms of a benchmark whose rounds are long (median round >=
    LONG_ROUND in the sessions' median): each side's round inflation and the load excess;
    () for short rounds, or sessions recorded without medians."""
    sides = [[(s["minimum"][name], s["median"][name]) for s in side
              if name in s.get("median", {}) and name in s["minimum"]]
             for side in (baseline_sessions, current_sessions)]
    medians = sorted(med for side in sides for _, med in side)
    if not medians or medians[len(medians) // 2] < LONG_ROUND:
        return ()
    return (*(inflation(*zip(*side)) if side else math.nan for side in sides),
            load_excess(load, usable_cores))


def analyse(baseline_sessions, current_sessions, threshold, stored=False,
            reference_comparable=True, usable_cores: int | None = None) -> list[dict]:
    """One row per benchmark. Interleaved: the verdict on absolute times with the
    reference's drift as allowance (none when the reference's code differs between the
    sides). `stored`: the verdict on x-reference figures (absolute times from another
    moment mean little)."""
    absolute = [s["minimum"] for s in baseline_sessions], [s["minimum"] for s in current_sessions]
    relative = [normalized(s) for s in baseline_sessions], [normalized(s) for s in current_sessions]
    names = sorted({n for side in absolute for s in side for n in s},
                   key=lambda n: (n != REFERENCE, n))
    drift = 1.0
    if reference_comparable and not stored:
        drift = verdict(*([s[REFERENCE] for s in side if REFERENCE in s] for side in absolute))["ratio"]
    failed_current = {n for s in current_sessions for n in s.get("failed", [])}
    cores = {n: c for s in baseline_sessions + current_sessions for n, c in s.get("cores", {}).items()}
    load = peak_load(current_sessions if stored else baseline_sessions + current_sessions)
    rows = []
    for name in names:
        b, c = ([s[name] for s in side if name in s] for side in absolute)
        nb, nc = ([s[name] for s in side if name in s] for side in relative)
        extra = long_round_noise(name, baseline_sessions, current_sessions, load, usable_cores)
        by_reference = verdict(nb, nc, threshold, extra_noise=extra, load=load)
        row = {"benchmark": name,
               **(by_reference if stored else verdict(b, c, threshold, drift, extra, load)),
               "reference_ratio": by_reference["ratio"],
               "baseline_best": min(b) if b else math.nan,
               "current_best": min(c) if c else math.nan,
               "baseline_x_reference": min(nb) if nb else math.nan,
               "current_x_reference": min(nc) if nc else math.nan,
               "baseline_sessions": b, "current_sessions": c}
        if stored:
            row["ratio_time"] = min(c) / min(b) if b and c else math.nan
        if name == REFERENCE:
            row["verdict"] = "yardstick"
        elif cores.get(name, 1) > 1 and usable_cores and not load < usable_cores \
                and row["verdict"] not in ("new", "missing on current"):
            # Whether a second core is free is the other jobs' doing: such a benchmark is
            # bimodal on a shared machine (a 2-thread step takes 46 or 91 us by session).
            row["verdict"] = f"not judged ({cores[name]} cores, load {load:.1f})"
        elif name in failed_current and not c:
            row["verdict"] = "FAILED on current"
        rows.append(row)
    return rows


def report_table(rows) -> str:
    lines = [f"{'benchmark':<46} {'baseline best':>14} {'current best':>13} {'ratio':>6} "
             f"{'spread b/c':>11} {'x ref b -> c':>17} {'x ref ratio':>11}  verdict"]
    for row in rows:
        spreads = f"{row['spread_baseline']:.0%}/{row['spread_current']:.0%}" \
            if row["spread_baseline"] == row["spread_baseline"] else "-"
        ratio = f"{row['ratio']:.3f}" if row["ratio"] == row["ratio"] else "-"
        relative = f"{row['reference_ratio']:.3f}" if row["reference_ratio"] == row["reference_ratio"] \
            else "-"
        reference = f"{row['baseline_x_reference']:.3g} -> {row['current_x_reference']:.3g}"
        verdict_text = row["verdict"]
        if row["verdict"] in ("REGRESSION", "faster"):
            verdict_text += f" (beyond +-{row['band']:.0%})"
        lines.append(f"{row['benchmark']:<46} {_format_seconds(row['baseline_best']):>14} "
                     f"{_format_seconds(row['current_best']):>13} {ratio:>6} {spreads:>11} "
                     f"{reference:>17} {relative:>11}  {verdict_text}")
    return "\n".join(lines)


def _load_text(sessions) -> str:
    before = [s["load_before_1_5_15"][0] for s in sessions if s.get("load_before_1_5_15")]
    after = [s["load_after_1_5_15"][0] for s in sessions if s.get("load_after_1_5_15")]
    values = before + after
    return f"{min(values):.2f}-{max(values):.2f}" if values else "unknown"


def command_compare(args) -> int:
    store = Path(args.store)
    path = baseline_path(store, args.name)
    if not path.is_file():
        known = sorted(p.stem for p in (store / "baselines").glob("*.json"))
        raise Refused(f"no baseline named {args.name!r} in {store / 'baselines'} "
                      f"(saved: {', '.join(known) or 'none'}; save one with "
                      f"`python benchmarks/baseline.py save {args.name}`)")
    saved = json.loads(path.read_text())
    if bool(saved.get("tiny")) != bool(args.tiny):
        raise Refused(f"baseline {args.name!r} was saved {'with' if saved.get('tiny') else 'without'} "
                      "--tiny; sizes differ, the figures are not comparable")
    machine = _machine_facts()
    warnings = []
    cross_machine = machine_differences(saved["machine"], machine, MACHINE_KEYS)
    libraries = machine_differences(saved["machine"], machine, LIBRARY_KEYS)
    if args.stored:
        if cross_machine and not args.allow_cross_machine:
            raise Refused("baseline saved on another machine: " + "; ".join(cross_machine) +
                          " (compare interleaved, without --stored, or pass --allow-cross-machine)")
        if cross_machine:
            warnings.append("CROSS-MACHINE COMPARISON (--allow-cross-machine): "
                            + "; ".join(cross_machine))
        if libraries:
            warnings.append("library versions differ from the baseline's: " + "; ".join(libraries))
        warnings.append("stored figures: the baseline was measured at another time, not "
                        "interleaved; verdicts are on multiples of each session's reference")
    elif cross_machine:
        warnings.append("the saved figures come from another machine (" + "; ".join(cross_machine) +
                        "); the verdict uses only this run's interleaved sessions")
    scratch = store / "sessions" / f"{stamp()}-compare-{args.name}"
    sessions = {"baseline": [], "current": []}
    if args.stored:
        sessions["baseline"] = saved["sessions"]
        order = ["current"] * args.sessions
        sources = {"current": ROOT / "src"}
    else:
        order = session_order(args.sessions)
        sources = {"baseline": worktree_source(store, saved["code"]["commit"]),
                   "current": ROOT / "src"}
    for index, side in enumerate(order):
        print(f"session {index + 1}/{len(order)}: {side} ...", file=sys.stderr, flush=True)
        sessions[side].append(run_session(sources[side], scratch / f"{index}-{side}.json",
                                          args.select or saved.get("select"), args.tiny,
                                          args.max_time))
    hashes = {s["reference_source_sha256"] for side in sessions.values() for s in side}
    if len(hashes - {None}) > 1:
        warnings.append("the reference (envs/cartpole/reference.py) differs between the sides: "
                        "the x-reference figures are not comparable across them, and no drift "
                        "allowance is made")
    rows = analyse(sessions["baseline"], sessions["current"], args.threshold,
                   stored=args.stored, reference_comparable=len(hashes - {None}) <= 1,
                   usable_cores=machine["usable_cores"])
    regressions = [r for r in rows if r["verdict"] in ("REGRESSION", "FAILED on current",
                                                       "missing on current")]
    all_sessions = sessions["baseline"] + sessions["current"]
    reference_row = next((r for r in rows if r["benchmark"] == REFERENCE), None)
    drift_text = "-" if reference_row is None else f"{reference_row['ratio']:.3f}"
    header = [
        f"baseline {args.name!r}: {saved['code']['commit'][:12]} ({saved['code']['source']}), "
        f"saved {saved['saved']}",
        f"current: the working tree ({ROOT})",
        f"machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores, "
        f"host {machine['hostname']}; python {machine['python']}, numpy {machine['numpy']}, "
        f"torch {machine['torch']}",
        f"sessions: {len(sessions['baseline'])} baseline + {len(sessions['current'])} current"
        + ("" if args.stored else " interleaved " + " ".join(s[0].upper() for s in order))
        + f"; 1-min load average {_load_text(all_sessions)} "
        f"(saved: {_load_text(saved['sessions'])})",
        f"rule: regression when best-of-sessions ratio - 1 > max({args.threshold:.0%}, "
        f"(1 + noise) ** {MARGIN:g} - 1), noise the spread of either side's session minima "
        f"(rounds >= {LONG_ROUND * 1e3:g} ms: also round inflation and load / cores - 1)" + (
            ", in x-reference figures" if args.stored else
            f", after the machine's drift (reference ratio {drift_text}) is allowed for"),
    ]
    busy = [s for s in all_sessions
            if (s.get("load_after_1_5_15") or [0])[0] > machine["usable_cores"]]
    if busy:
        warnings.append(f"{len(busy)} of {len(all_sessions)} sessions ended with the load average "
                        f"above the {machine['usable_cores']} usable cores: the machine was shared")
    if any(r["verdict"].startswith("not judged (noise") for r in rows):
        warnings.append("slowdowns over the threshold but inside this run's measured noise are "
                        "not judged (not regressions): rerun on a quieter machine or with more "
                        "--sessions to judge them")
    if any(re.match(r"not judged \(\d+ cores", r["verdict"]) for r in rows):
        warnings.append("benchmarks that keep several cores busy are not judged: the load "
                        f"average reached {peak_load(all_sessions):.1f} on "
                        f"{machine['usable_cores']} usable cores, so whether their other cores "
                        "were free depended on other jobs")
    text = "\n".join(header + [f"WARNING: {w}" for w in warnings] + ["", report_table(rows)])
    outcome = (f"\nverdict: REGRESSION in {len(regressions)} benchmark(s): "
               + ", ".join(r["benchmark"] for r in regressions)) if regressions \
        else "\nverdict: no regression"
    print(text + outcome)
    report = {"schema": "peregrine.bench-compare/1", "baseline": args.name, "saved": saved["code"],
              "machine": machine, "warnings": warnings, "threshold": args.threshold,
              "stored": args.stored, "order": order, "sessions": sessions, "rows": rows,
              "regressions": [r["benchmark"] for r in regressions]}
    report_path = store / "compare" / f"{stamp()}-{args.name}.json"
    write_json(report_path, report)
    print(f"report: {report_path}")
    return EXIT_REGRESSION if regressions else EXIT_OK


def command_list(args) -> int:
    store = Path(args.store)
    for path in sorted((store / "baselines").glob("*.json")):
        saved = json.loads(path.read_text())
        print(f"{saved['name']:<20} {saved['code']['commit'][:12]}  {saved['saved']}  "
              f"{saved['machine']['cpu_model']} x{saved['machine']['usable_cores']}"
              f"{'  (tiny)' if saved.get('tiny') else ''}  {saved['code']['source']}")
    return EXIT_OK


def command_clean(args) -> int:
    """Removes the baseline worktrees (they are rebuilt on the next compare)."""
    store = Path(args.store)
    for path in sorted((store / "worktrees").glob("*")):
        git("worktree", "remove", "--force", str(path))
        print(f"removed {path}")
    git("worktree", "prune")
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    main.add_argument("--store", default=str(ROOT / ".benchmarks"),
                      help="where baselines, worktrees and reports live (default .benchmarks/)")
    commands = main.add_subparsers(dest="command", required=True)

    def common(sub):
        sub.add_argument("name", help="the baseline's name (letters, digits, . _ -)")
        sub.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS,
                         help=f"sessions per side (default {DEFAULT_SESSIONS}; at least 2)")
        sub.add_argument("-k", dest="select", default=None,
                         help="pytest -k expression: only these benchmarks (the reference always runs)")
        sub.add_argument("--tiny", action="store_true",
                         help="PEREGRINE_BENCH_TINY sizes (a smoke run; not for real verdicts)")
        sub.add_argument("--max-time", type=float, default=0.25,
                         help="pytest-benchmark's --benchmark-max-time per benchmark (default 0.25 s)")

    save = commands.add_parser("save", help="measure the code and save it as baseline NAME")
    common(save)
    save.add_argument("--rev", default=None,
                      help="a commit to save instead of the working tree (measured in a worktree)")
    compare = commands.add_parser("compare", help="compare the working tree against baseline NAME")
    common(compare)
    compare.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                         help=f"smallest slowdown called a regression (default {DEFAULT_THRESHOLD})")
    compare.add_argument("--stored", action="store_true",
                         help="compare with the saved figures instead of re-measuring the baseline")
    compare.add_argument("--allow-cross-machine", action="store_true",
                         help="with --stored: compare with a baseline saved on another machine")
    commands.add_parser("list", help="the saved baselines")
    commands.add_parser("clean", help="remove the baseline worktrees")
    return main


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "name", None) is not None and not NAME.match(args.name):
        print(f"baseline.py: bad name {args.name!r}: use letters, digits, '.', '_', '-'",
              file=sys.stderr)
        return EXIT_REFUSED
    if getattr(args, "sessions", 2) < 2:
        print(f"baseline.py: --sessions must be at least 2 (a spread needs two), got "
              f"{args.sessions}", file=sys.stderr)
        return EXIT_REFUSED
    if getattr(args, "threshold", 0.0) < 0 or getattr(args, "max_time", 1.0) <= 0:
        print("baseline.py: --threshold must be >= 0 and --max-time > 0", file=sys.stderr)
        return EXIT_REFUSED
    handlers = {"save": command_save, "compare": command_compare, "list": command_list,
                "clean": command_clean}
    try:
        return handlers[args.command](args)
    except Refused as error:
        print(f"baseline.py: refused: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except SessionFailed as error:
        print(f"baseline.py: {error}", file=sys.stderr)
        return EXIT_SESSION_FAILED


if __name__ == "__main__":
    sys.exit(main())
