"""Cold start: wall time from the shell to a solved, saved CartPole run.

    python benchmarks/bench_cold_start.py                    # 7 runs, median
    python benchmarks/bench_cold_start.py --runs 11 --breakdown
    python benchmarks/bench_cold_start.py --source /tmp/old/src   # compare with another tree
    python benchmarks/bench_cold_start.py --mode detach      # headless (`--detach`)
    python benchmarks/bench_cold_start.py --mode plain --mode detach --mode monitor

Each run is a fresh interpreter doing exactly what a user types,
`peregrine train cartpole` with the shipped config (here
`python -m peregrine.cli train cartpole --run-dir TMP`, plain progress lines
since stdout is a pipe; `--mode detach` adds `--detach`, `--mode monitor` adds
`--monitor`, the dashboard child a terminal gets), timed from process start to
exit, like hyperfine. It reports the median, min and max wall time and
the median training time the run itself prints ("N steps in X s of training"),
so the rest (interpreter, imports, env build, checkpoint, PNG) is their
difference, and how many runs were solved (the final "recent mean return" at
least CartPole-v1's 475) with their checkpoint saved. With `--source` (another
tree's source folder, its `peregrine` package first on PYTHONPATH) or several
`--mode`s, the runs alternate between every source and mode, so load on a
shared machine hits all alike; the ratio to the first is printed.

`--breakdown` runs once more with `python -X importtime` and lists the
costliest top-level imports of that run (importtime's own overhead inflates
them; read them as shares, not as times).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (not through suite_common: its OPENBLAS_NUM_THREADS would reach the timed runs)
from peregrine.train.run_dir import checkpoint_path
from peregrine.vector.common import available_cores

HERE_SOURCE = Path(__file__).resolve().parents[1] / "src"
TRAINING = re.compile(r"([\d,]+) steps in ([\d.]+) s of training")
RECENT = re.compile(r"recent mean return ([\d.]+)")
SOLVED = 475.0   # Gymnasium's CartPole-v1 threshold, the shipped config's stop_return


MODES = {"plain": [], "detach": ["--detach"], "monitor": ["--monitor"]}


def command(run_dir: Path, mode: str = "plain", extra=()) -> list[str]:
    return [sys.executable, *extra, "-m", "peregrine.cli", "train", "cartpole", "--run-dir",
            str(run_dir), *MODES[mode]]


def environment(source: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(source), os.environ.get("PYTHONPATH", "")]))


def one_run(source: Path, mode: str, scratch: Path, index: int) -> dict:
    run_dir = scratch / f"run-{index}"
    start = time.perf_counter()
    result = subprocess.run(command(run_dir, mode), env=environment(source), capture_output=True,
                            text=True, timeout=600)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"run failed ({result.returncode}):\n{result.stderr}")
    match = TRAINING.search(result.stdout)
    saved = checkpoint_path(run_dir).is_file()
    recent = RECENT.search(result.stdout)
    return {"wall": wall, "training": float(match.group(2)) if match else float("nan"),
            "steps": int(match.group(1).replace(",", "")) if match else 0, "saved": saved,
            "solved": recent is not None and float(recent.group(1)) >= SOLVED}


def breakdown(source: Path, mode: str, scratch: Path, top: int = 10) -> None:
    result = subprocess.run(command(scratch / "importtime", mode, ["-X", "importtime"]),
                            env=environment(source), capture_output=True, text=True, timeout=600)
    rows, torch = [], 0.0
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if not cumulative.strip().isdigit():
            continue
        if name.strip() == "torch":
            torch = int(cumulative) / 1e6
        if name.startswith("  "):
            continue  # nested import: counted in its top-level parent
        rows.append((int(cumulative) / 1e6, name.strip()))
    total = sum(seconds for seconds, _ in rows)
    print(f"\ntop-level imports of one run under -X importtime (sum {total:.2f} s, inflated; "
          f"torch alone {torch:.2f} s):")
    for seconds, name in sorted(rows, reverse=True)[:top]:
        print(f"  {seconds:6.2f} s  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per source tree (median)")
    parser.add_argument("--source", action="append", default=[], type=Path,
                        help="another src folder to compare (repeatable)")
    parser.add_argument("--breakdown", action="store_true", help="one -X importtime run")
    parser.add_argument("--mode", action="append", choices=sorted(MODES),
                        help="plain (default: progress lines, as when piped), detach "
                             "(--detach) or monitor (--monitor, the dashboard a terminal "
                             "gets); repeat to alternate between modes")
    args = parser.parse_args()
    modes = args.mode or ["plain"]
    variants = [(source, mode) for source in [HERE_SOURCE, *args.source] for mode in modes]
    results = {variant: [] for variant in variants}
    with tempfile.TemporaryDirectory(prefix="peregrine-cold-") as scratch:
        scratch = Path(scratch)
        start_load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        one_run(*variants[0], scratch, -1)  # warm the file cache; not counted
        for index in range(args.runs):
            for number, variant in enumerate(variants):
                results[variant].append(one_run(*variant, scratch / str(number), index))
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        for mode in modes:
            print(f"command ({mode}): " + " ".join(command(Path("RUN_DIR"), mode)))
        cores = available_cores()
        print(f"{args.runs} runs each, {cores} usable core{'' if cores == 1 else 's'} (affinity "
              f"and cgroup quota; {os.cpu_count()} logical), load average {start_load:.2f} at "
              f"the start, {load:.2f} at the end")
        first = None
        for (source, mode), runs in results.items():
            walls = [r["wall"] for r in runs]
            median = statistics.median(walls)
            first = first or median
            training = statistics.median(r["training"] for r in runs)
            print(f"{str(source):<40} {mode:<8} median {median:5.2f} s (min {min(walls):.2f}, max "
                  f"{max(walls):.2f}); training {training:.2f} s, rest {median - training:.2f} s; "
                  f"steps {statistics.median(r['steps'] for r in runs):,.0f}; "
                  f"solved {sum(r['solved'] for r in runs)}/{len(runs)}, "
                  f"saved {sum(r['saved'] for r in runs)}/{len(runs)}; x{median / first:.2f}")
        if args.breakdown:
            breakdown(*variants[0], scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
