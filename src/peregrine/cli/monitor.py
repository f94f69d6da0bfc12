"""`peregrine monitor RUN_DIR|RUN_ID | --latest | --list`: attach a dashboard to a run.

The monitor only reads the run's memory-mapped metrics file, in its own
process: start it, stop it (Ctrl-C detaches) or kill it at any time; the
trainer never notices. Exit codes: 0 shown/detached, 1 the run or its metrics
file is missing, truncated, corrupt or foreign (with a message saying which),
2 bad arguments.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..monitor.metrics import FILE_NAME, FINAL_STATUSES, MetricsFileError, MetricsReader

EXIT_OK = 0
EXIT_BAD_RUN = 1


def add_arguments(parser) -> None:
    parser.add_argument("run", nargs="?", help="a run directory, or a run id under --runs-dir")
    parser.add_argument("--latest", action="store_true", help="the most recently started run in --runs-dir")
    parser.add_argument("--list", action="store_true", help="list the runs in --runs-dir and exit")
    parser.add_argument("--runs-dir", default="runs", help="where runs live (default: ./runs)")
    parser.add_argument("--once", action="store_true",
                        help="print one frame as plain text and exit (for scripts and screenshots)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes (default 0.5)")
    parser.add_argument("--stale-after", type=float, default=10.0,
                        help="seconds without a heartbeat before a run counts as silent/stale (default 10)")
    parser.add_argument("--wait", type=float, default=15.0,
                        help="seconds to wait for the metrics file to appear (live mode; default 15)")
    parser.add_argument("--width", type=int, default=100, help="text width for --once/--list (default 100)")
    parser.add_argument("--stay", action="store_true",
                        help="keep showing the last frame after the run ends (until Ctrl-C)")


def run_directories(runs_dir: Path) -> list[Path]:
    """Subdirectories of `runs_dir` holding a metrics file, oldest first."""
    if not runs_dir.is_dir():
        return []
    found = [path for path in runs_dir.iterdir() if (path / FILE_NAME).is_file()]
    return sorted(found, key=_start_time)


def _start_time(run_dir: Path) -> float:
    try:
        with MetricsReader(run_dir) as reader:
            return reader.header.start_time
    except MetricsFileError:
        return (run_dir / FILE_NAME).stat().st_mtime


def resolve_run(args) -> Path:
    """The metrics file's directory the arguments name (ValueError if none or two)."""
    chosen = sum(bool(x) for x in (args.run, args.latest))
    if chosen != 1:
        raise ValueError("give exactly one of RUN (a run directory or run id), --latest or --list")
    runs_dir = Path(args.runs_dir)
    if args.latest:
        runs = run_directories(runs_dir)
        if not runs:
            raise MetricsFileError(f"no runs with a {FILE_NAME} under {runs_dir}/")
        return runs[-1]
    candidate = Path(args.run)
    if candidate.is_file() and candidate.name != FILE_NAME:
        raise MetricsFileError(f"{args.run!r} is a file, not a run directory or its {FILE_NAME}")
    if candidate.exists():
        return candidate.parent if candidate.is_file() else candidate
    # a run id is looked for under the runs folder; a path (runs/NAME) is taken as given
    under = candidate if len(candidate.parts) > 1 else runs_dir / args.run
    if under.exists() or not args.once:
        return under  # live mode may wait for a run that is about to start
    raise MetricsFileError(f"no run {args.run!r}: neither a directory nor a run id under {runs_dir}/")


def list_runs(runs_dir: Path, stale_after: float, width: int) -> str:
    from rich.console import Console
    from rich.table import Table

    from ..monitor.dashboard import duration, number

    table = Table(title=f"runs in {runs_dir}/", title_justify="left")
    for column in ("run", "state", "steps", "SPS", "return", "elapsed", "started"):
        table.add_column(column, justify="left" if column in ("run", "state", "started") else "right")
    for run_dir in run_directories(runs_dir):
        try:
            with MetricsReader(run_dir) as reader:
                record = reader.read()
                state = reader.liveness(record, stale_after)
                started = time.strftime("%Y-%m-%d %H:%M", time.localtime(reader.header.start_time))
                if record is None:
                    table.add_row(run_dir.name, state, "-", "-", "-", "-", started)
                else:
                    table.add_row(run_dir.name, state, number(record["global_step"]), number(record["sps"]),
                                  number(record["episode_return"]), duration(record["elapsed"]), started)
        except MetricsFileError as error:
            reason = str(error).replace(str(run_dir / FILE_NAME), "metrics file")
            table.add_row(run_dir.name, f"unreadable: {reason}", "-", "-", "-", "-", "-")
    console = Console(width=width, color_system=None, force_terminal=False)
    with console.capture() as capture:
        console.print(table)
    return capture.get()


def _open_when_ready(run_dir: Path, wait: float) -> MetricsReader:
    deadline = time.monotonic() + wait
    while True:
        try:
            return MetricsReader(run_dir)
        except MetricsFileError:
            if (run_dir / FILE_NAME).exists() or time.monotonic() >= deadline:
                raise  # a file that exists but does not parse will not fix itself
            time.sleep(0.2)


def live(run_dir: Path, args) -> int:
    import signal
    import threading

    from rich.console import Console
    from rich.live import Live

    from ..monitor.dashboard import Snapshot, render

    reader = _open_when_ready(run_dir, args.wait)
    console = Console()
    # Ctrl-C sets a flag the loop checks between frames. A KeyboardInterrupt
    # raised at an arbitrary point could land while Rich's refresh lock is held,
    # and leaving the Live view would then wait for its refresh thread forever.
    detach = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: detach.set())
    try:
        print(f"peregrine monitor: attached to {run_dir} (Ctrl-C detaches; training is unaffected)",
              file=sys.stderr, flush=True)
        with Live(render(Snapshot.take(reader, stale_after=args.stale_after), console.width), console=console,
                  refresh_per_second=max(1.0, 1.0 / max(args.interval, 0.05)), screen=False) as view:
            while not detach.wait(args.interval):
                if _replaced(reader):          # a new run in the same directory
                    reader.close()
                    reader = MetricsReader(run_dir)
                snapshot = Snapshot.take(reader, stale_after=args.stale_after)
                view.update(render(snapshot, console.width))
                if not args.stay and snapshot.liveness in (*FINAL_STATUSES, "stale"):
                    break
        if detach.is_set():
            console.print("[dim]detached (training is unaffected)[/dim]")
    finally:
        signal.signal(signal.SIGINT, previous)
        reader.close()
    return EXIT_OK


def _replaced(reader: MetricsReader) -> bool:
    try:
        return reader.path.stat().st_ino != reader.inode
    except OSError:
        return False


def run(args) -> int:
    if args.interval <= 0:
        raise ValueError(f"--interval must be positive, got {args.interval}")
    if args.width < 40:
        raise ValueError(f"--width must be at least 40, got {args.width}")
    try:
        if args.list:
            print(list_runs(Path(args.runs_dir), args.stale_after, args.width), end="")
            return EXIT_OK
        run_dir = resolve_run(args)
        if args.once:
            from ..monitor.dashboard import Snapshot, render_text

            with MetricsReader(run_dir) as reader:
                print(render_text(Snapshot.take(reader, stale_after=args.stale_after), args.width), end="")
            return EXIT_OK
        return live(run_dir, args)
    except MetricsFileError as error:
        print(f"peregrine monitor: {error}", file=sys.stderr)
        return EXIT_BAD_RUN
    except KeyboardInterrupt:  # e.g. while waiting for the run to start
        print("peregrine monitor: detached", file=sys.stderr)
        return EXIT_OK


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="peregrine monitor")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
