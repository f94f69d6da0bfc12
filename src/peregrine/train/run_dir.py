"""Who owns a run directory, and what a new run may do with one that exists.

One owner. A run (and a resume) holds an advisory lock, `fcntl.flock` on
RUN_DIR/run.lock, from before it writes anything until its process ends; the
kernel drops it when the process dies, however it dies, so there is no stale
lock to clear after a crash. The file says who holds it (pid, host, start time),
so a second run into the same directory is refused naming its owner. The lock
is advisory: it keeps Peregrine runs apart, not other programs.

A new run (neither `--resume` nor a restart by torchrun) takes a directory that
does not exist or is empty. Otherwise:

* a directory holding a checkpoint holds a run: refused, naming `--resume` and
  `--overwrite`; `--overwrite` moves the whole directory aside, to
  NAME.replaced-<UTC time> beside it, and starts clean;
* a directory holding only a run's own files but no checkpoint is an attempt
  that crashed before its first checkpoint (nothing to resume): its files are
  removed, with a note, so rerunning the same command starts clean instead of
  appending a second history to the first. "A run's own files" is checked inside
  its folders too: `checkpoints/` may hold only a checkpoint's temporary files and
  `tensorboard/` only event files; a file a user put there (a model they keep,
  notes) makes the directory "not a run's" (issue 35);
* anything else (files that are not a run's) is refused unless `--overwrite`:
  Peregrine never deletes what a user made without it.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ..files import partial_prefix

LOCK_NAME = "run.lock"
# Where a run keeps its checkpoint: RUN_DIR/checkpoints/latest.pt (checkpoint_path).
CHECKPOINT_FOLDER, CHECKPOINT_NAME = "checkpoints", "latest.pt"
# What a run writes into its directory (train/run.py, train/run_log.py, the
# monitor's metrics.bin, TensorBoard): what a crashed attempt may leave behind.
RUN_FILES = ("config.toml", "metrics.jsonl", "metrics.bin", "learning_curve.png",
             "tensorboard", CHECKPOINT_FOLDER, "wandb", LOCK_NAME)     # wandb: --train.track
# What a run writes inside its folders before its first checkpoint: a checkpoint's
# temporary file (peregrine.files: .latest.partialPID.pt) and TensorBoard's event files.
RUN_FOLDER_PREFIXES = {CHECKPOINT_FOLDER: (partial_prefix(CHECKPOINT_NAME),),
                       "tensorboard": ("events.out.tfevents.",)}


class RunDirectoryError(ValueError):
    """A run directory that this run may not take (in use, holds a run, not a run)."""


def checkpoint_path(run_dir: str | os.PathLike[str]) -> Path:
    """The checkpoint file of the run in `run_dir` (the one place that names it)."""
    return Path(run_dir) / CHECKPOINT_FOLDER / CHECKPOINT_NAME


class RunLock:
    """The lock on `run_dir` (created if needed) for the life of this object's
    process; RunDirectoryError naming the holder when another process has it.
    With `announce` False the lock file is left as it is (a probe: is it free?)."""

    def __init__(self, run_dir: str | os.PathLike[str], announce: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / LOCK_NAME
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(self._fd)
            os.close(self._fd)
            raise RunDirectoryError(f"run directory {str(self.run_dir)!r} is in use by {holder}; "
                                    f"a run directory has one owner at a time: wait for it to "
                                    f"end, or stop it, or train into another --run-dir") from None
        except BaseException:
            os.close(self._fd)
            raise
        if announce:
            self.announce()

    def announce(self) -> None:
        """Writes who holds the lock (pid, host, time) into the lock file."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()} {socket.gethostname()} {stamp}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)      # closing the only descriptor drops the lock
            self._fd = None


def _holder(fd: int) -> str:
    """'process PID on HOST (since TIME)' from a held lock file."""
    for _ in range(20):      # the owner writes its line just after taking the lock
        words = os.pread(fd, 256, 0).decode(errors="replace").split(maxsplit=2)
        if len(words) >= 2:
            since = f" (since {words[2].strip()})" if len(words) == 3 else ""
            return f"process {words[0]} on {words[1]}{since}"
        time.sleep(0.01)
    return "another process"


def describe(run_dir: str | os.PathLike[str]) -> str:
    """'missing', 'empty', 'run' (holds a checkpoint), 'attempt' (a run's files, no
    checkpoint) or 'other'."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return "missing"        # (a file in the way: claim_new refuses it)
    names = {entry.name for entry in run_dir.iterdir()} - {LOCK_NAME}
    if not names:
        return "empty"
    if checkpoint_path(run_dir).is_file():
        return "run"
    if not names <= set(RUN_FILES):
        return "other"
    return "attempt" if all(_only_run_made(run_dir / name, prefixes)
                            for name, prefixes in RUN_FOLDER_PREFIXES.items()) else "other"


def _only_run_made(folder: Path, prefixes: tuple[str, ...]) -> bool:
    """True when `folder` (a run's checkpoints/ or tensorboard/) is missing or holds
    only plain files a run writes there: nothing a user could have put in it."""
    if not os.path.lexists(folder):
        return True
    if folder.is_symlink() or not folder.is_dir():
        return False
    return all(entry.is_file(follow_symlinks=False) and entry.name.startswith(prefixes)
               for entry in os.scandir(folder))


def refusal(run_dir: str | os.PathLike[str], state: str) -> str | None:
    """Why a new run may not take a directory in `state` without --overwrite (None
    when it may)."""
    if state == "run":
        return (f"run directory {str(run_dir)!r} already holds a run (a checkpoint); continue "
                f"it with --resume {run_dir} (in Python: train(config, run_dir, resume=True)), "
                f"or pass --overwrite (overwrite=True) to move it aside and start a new run "
                f"there")
    if state == "other":
        return (f"run directory {str(run_dir)!r} is not empty and holds no Peregrine run; "
                f"choose another --run-dir (run_dir), or pass --overwrite (overwrite=True) to "
                f"move it aside")
    return None


def claim_new(run_dir: str | os.PathLike[str], overwrite: bool = False) -> RunLock:
    """Locks `run_dir` for a new run, making it fit for one (see the module
    docstring); returns the lock to hold for the life of the run."""
    run_dir = Path(run_dir)
    if os.path.lexists(run_dir) and not run_dir.is_dir():
        raise RunDirectoryError(f"run directory {str(run_dir)!r} is a file, not a directory: "
                                f"choose another --run-dir (run_dir)")
    _refuse_if_in_use(run_dir)
    if not overwrite:      # refused before anything is written into the directory
        problem = refusal(run_dir, describe(run_dir))
        if problem is not None:
            raise RunDirectoryError(problem)
    lock = RunLock(run_dir, announce=False)    # a run moved aside keeps its lock file as it was
    try:
        state = describe(run_dir)      # again, under the lock
        if overwrite and state in ("run", "attempt", "other"):
            aside = _aside(run_dir)
            run_dir.rename(aside)       # our lock file goes with it, still held
            print(f"peregrine train: moved the previous contents of {run_dir} to {aside}",
                  file=sys.stderr, flush=True)
            new_lock = RunLock(run_dir)
            lock.release()
            return new_lock
        problem = refusal(run_dir, state)
        if problem is not None:
            raise RunDirectoryError(problem)
        lock.announce()
        if state == "attempt":
            for name in RUN_FILES:
                path = run_dir / name
                if name == LOCK_NAME or not os.path.lexists(path):
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            print(f"peregrine train: {run_dir} held an attempt that never reached a checkpoint "
                  f"(nothing to resume); starting clean", file=sys.stderr, flush=True)
        return lock
    except BaseException:
        lock.release()
        raise


def _aside(run_dir: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}")
    suffix = 1
    while aside.exists():
        suffix += 1
        aside = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}-{suffix}")
    return aside


def _refuse_if_in_use(run_dir: Path) -> None:
    """RunDirectoryError naming the owner when a live process holds the lock
    (creates nothing)."""
    if (run_dir / LOCK_NAME).is_file():
        RunLock(run_dir, announce=False).release()


def check_new(run_dir: str | os.PathLike[str], resume: bool, overwrite: bool) -> None:
    """The launcher's early look (`--nproc`): the error a rank would raise, before
    any rank starts. Takes nothing: the ranks lock and claim."""
    run_dir = Path(run_dir)
    _refuse_if_in_use(run_dir)
    if not resume and not overwrite:
        problem = refusal(run_dir, describe(run_dir))
        if problem is not None:
            raise RunDirectoryError(problem)
