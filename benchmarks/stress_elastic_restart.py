"""Kill-and-restart trials of an elastic run (issue 35, case 9): outside the suite.

Each trial runs `peregrine train cartpole --nproc 2 --max-restarts 1` (14 updates,
a checkpoint every 3), SIGKILLs the second rank after update 7 and requires the
restarted ranks to finish: exit 0, updates 1..14 each logged once, a checkpoint at
update 14. A trial that fails prints the launcher's stderr tail (a Gloo
`connectFullMesh ... Connection refused` in the restart was the issue's failure).

    python benchmarks/stress_elastic_restart.py --trials 20

Exit status 0 when every trial passed. Takes about 15-30 s a trial on two cores.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WAIT = 180


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        kids = children(frontier.pop())
        found += kids
        frontier += kids
    return found


def trial(run_dir: Path) -> tuple[bool, str]:
    environ = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
    total = 14 * 2 * 4 * 32      # 14 updates of 2 ranks x 4 envs x 32 steps
    command = [sys.executable, "-m", "peregrine", "train", "cartpole", "--detach",
               "--vec.num-envs", "4", "--train.tensorboard", "false", "--train.stop-return", "0",
               "--total-steps", str(total), "--run-dir", str(run_dir), "--nproc", "2",
               "--max-restarts", "1", "--train.horizon", "32", "--train.minibatch-size", "64",
               "--train.checkpoint-interval", "3"]
    job = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT
        while len([r for r in records(run_dir) if "updates" in r]) < 7:
            if job.poll() is not None:
                return False, "ended before the kill:\n" + job.communicate()[1][-3000:]
            if time.monotonic() > deadline:
                return False, "never reached update 7"
            time.sleep(0.05)
        ranks = descendants(job.pid)
        os.kill(max(ranks), signal.SIGKILL)     # the second rank started
        _out, err = job.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        return False, "the restarted run hung"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    lines = records(run_dir)
    seen = [r["updates"] for r in lines if "updates" in r]
    ok = job.returncode == 0 and seen == list(range(1, 15)) and lines[-1] == {"status": "finished"}
    return ok, "" if ok else f"exit {job.returncode}, updates {seen}\n{err[-3000:]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    passed = 0
    for index in range(1, args.trials + 1):
        with tempfile.TemporaryDirectory() as folder:
            start = time.monotonic()
            ok, why = trial(Path(folder) / "run")
        passed += ok
        print(f"trial {index}: {'ok' if ok else 'FAILED'} ({time.monotonic() - start:.1f} s)",
              flush=True)
        if not ok:
            print(why, flush=True)
    print(f"{passed} of {args.trials} trials passed")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
