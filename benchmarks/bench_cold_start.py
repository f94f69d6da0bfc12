"""Cold start: wall time from the shell to a solved, saved CartPole run.

    python benchmarks/bench_cold_start.py                    # 7 runs, median
    python benchmarks/bench_cold_start.py --runs 11 --breakdown
    python benchmarks/bench_cold_start.py --source /tmp/old/src   # compare with another tree
    python benchmarks/bench_cold_start.py --monitor          # with the dashboard child
    python benchmarks/bench_cold_start.py --detach           # headless (`--detach`)

Each run is a fresh interpreter doing exactly what a user types,
`peregrine train cartpole` with the shipped config (here
`python -m peregrine.cli train cartpole --run-dir TMP`, plain progress lines
since stdout is a pipe; `--detach` for the headless mode), timed from process
start to exit, like hyperfine. It reports the median, min and max wall time and
the median training time the run itself prints ("N steps in X s of training"),
so the rest (interpreter, imports, env build, checkpoint, PNG) is their
difference, and how many runs were solved (the final "recent mean return" at
least CartPole-v1's 475) with their checkpoint saved. With `--source`,
the runs alternate between this tree and each given source folder (its
`peregrine` package first on PYTHONPATH), so load on a shared machine hits
all alike; the ratio to the first is printed.

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

HERE_SOURCE = Path(__file__).resolve().parents[1] / "src"
TRAINING = re.compile(r"([\d,]+) steps in ([\d.]+) s of training")
RECENT = re.compile(r"recent mean return ([\d.]+)")
SOLVED = 475.0   # Gymnasium's CartPole-v1 threshold, the shipped config's stop_return


TRAIN_FLAGS: list[str] = []   # --monitor or --detach, as given


def command(run_dir: Path, extra=()) -> list[str]:
    return [sys.executable, *extra, "-m", "peregrine.cli", "train", "cartpole", "--run-dir",
            str(run_dir), *TRAIN_FLAGS]


def environment(source: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(source), os.environ.get("PYTHONPATH", "")]))


def one_run(source: Path, scratch: Path, index: int) -> dict:
    run_dir = scratch / f"run-{index}"
    start = time.perf_counter()
    result = subprocess.run(command(run_dir), env=environment(source), capture_output=True,
                            text=True, timeout=600)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"run failed ({result.returncode}):\n{result.stderr}")
    match = TRAINING.search(result.stdout)
    saved = (run_dir / "checkpoints" / "latest.pt").is_file()
    recent = RECENT.search(result.stdout)
    return {"wall": wall, "training": float(match.group(2)) if match else float("nan"),
            "steps": int(match.group(1).replace(",", "")) if match else 0, "saved": saved,
            "solved": recent is not None and float(recent.group(1)) >= SOLVED}


def breakdown(source: Path, scratch: Path, top: int = 10) -> None:
    result = subprocess.run(command(scratch / "importtime", ["-X", "importtime"]),
                            env=environment(source), capture_output=True, text=True, timeout=600)
    rows = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if name.startswith("  ") or not cumulative.strip().isdigit():
            continue  # nested import: counted in its top-level parent
        rows.append((int(cumulative) / 1e6, name.strip()))
    total = sum(seconds for seconds, _ in rows)
    print(f"\ntop-level imports of one run under -X importtime (sum {total:.2f} s, inflated):")
    for seconds, name in sorted(rows, reverse=True)[:top]:
        print(f"  {seconds:6.2f} s  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per source tree (median)")
    parser.add_argument("--source", action="append", default=[], type=Path,
                        help="another src folder to compare (repeatable)")
    parser.add_argument("--breakdown", action="store_true", help="one -X importtime run")
    display = parser.add_mutually_exclusive_group()
    display.add_argument("--monitor", action="store_true",
                         help="train with --monitor (the dashboard a terminal gets by default)")
    display.add_argument("--detach", action="store_true", help="train with --detach (headless)")
    args = parser.parse_args()
    if args.monitor or args.detach:
        TRAIN_FLAGS.append("--monitor" if args.monitor else "--detach")
    sources = [HERE_SOURCE, *args.source]
    results = {source: [] for source in sources}
    with tempfile.TemporaryDirectory(prefix="peregrine-cold-") as scratch:
        scratch = Path(scratch)
        start_load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        one_run(sources[0], scratch, -1)  # warm the file cache; not counted
        for index in range(args.runs):
            for source in sources:
                results[source].append(one_run(source, scratch / str(len(results[source])), index))
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print("command: " + " ".join(command(Path("RUN_DIR"))))
        print(f"{args.runs} runs each, {os.cpu_count()} CPUs, load average {start_load:.2f} at "
              f"the start, {load:.2f} at the end")
        first = None
        for source, runs in results.items():
            walls = [r["wall"] for r in runs]
            median = statistics.median(walls)
            first = first or median
            training = statistics.median(r["training"] for r in runs)
            print(f"{str(source):<50} median {median:5.2f} s (min {min(walls):.2f}, max "
                  f"{max(walls):.2f}); training {training:.2f} s, rest {median - training:.2f} s; "
                  f"steps {statistics.median(r['steps'] for r in runs):,.0f}; "
                  f"solved {sum(r['solved'] for r in runs)}/{len(runs)}, "
                  f"saved {sum(r['saved'] for r in runs)}/{len(runs)}; x{median / first:.2f}")
        if args.breakdown:
            breakdown(sources[0], scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
