"""A training run: its directory, the update loop, checkpoints, Ctrl-C.

Run directory (default runs/<env>-<UTC time>-s<seed>/):

    config.toml              the resolved configuration (read back by --resume)
    metrics.jsonl            one JSON record per update, then {"status": ...}
    metrics.bin              the live record the monitor reads (peregrine.monitor)
    learning_curve.png       episode return against steps, drawn when the run ends
    checkpoints/latest.pt    model, optimizer, RNG states, counters, config, env state
    tensorboard/             event files, when train.tensorboard is true
    wandb/                   Weights & Biases files, when train.track = "wandb"

Checkpoints are taken only at update boundaries, every
`train.checkpoint_interval` updates, at the end and on Ctrl-C: the first
Ctrl-C lets the current update finish (a fraction of a second) and saves, so
`--resume` continues exactly; a second Ctrl-C stops at once. SIGTERM (what
Slurm, Kubernetes and torchrun send to preempt a job) takes the same path,
status "interrupted", and the summary names the signal (the CLI exits with
128 + 15 = 143); a repeated SIGTERM never escalates, since schedulers may
send it more than once and follow it with SIGKILL anyway.

One owner: a run and a resume hold the run directory's lock for their life,
and a new run takes only an empty directory (run_dir.py). A rank that torchrun
restarted (`--max-restarts`) continues from the run's last checkpoint by itself.

Several ranks (torchrun, `peregrine train --nproc N`; see distributed.py): every
rank trains, rank 0 alone writes the run directory (its name is broadcast to the
others); Ctrl-C on the launcher reaches every rank, the ranks agree on the
update to stop after, and rank 0 saves once with every rank's state. Rank 0
alone reads the checkpoint on resume and sends it to the others, so after a
restart the other nodes need no copy of the run directory. A rank dies with
the launcher that started it (vector/lifetime.py).
A resumed run first cuts metrics.jsonl and TensorBoard back to the
checkpoint's update (see metrics.RunLogger), since a crash may have logged
updates that are redone.
"""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from ..vector.lifetime import die_with_parent, watch_parent
from . import checkpoint
from . import distributed
from .config import Config, load_config, read_toml
from .run_log import RunLogger
from .ppo import Trainer
from .run_dir import RunLock, checkpoint_path, claim_new


def new_run_dir(config: Config) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    parent = Path(config.train.run_dir)
    # An emulated env's name (gym:ALE/Pong-v5) as one safe path component.
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in config.env_name)
    base = f"{name}-{stamp}-s{config.train.seed}"
    path, suffix = parent / base, 1
    while path.exists():
        suffix += 1
        path = parent / f"{base}-{suffix}"
    return path


def load_run_config(run_dir: str | os.PathLike[str], overrides: Sequence = ()) -> Config:
    """The resolved config of an existing run, with `overrides` applied on top."""
    run_dir = Path(run_dir)
    path = run_dir / "config.toml"
    if not path.is_file():
        raise ValueError(f"--resume {str(run_dir)!r}: no config.toml there; is it a run directory?")
    base = read_toml(path)
    name = base.get("env", {}).get("name")
    return load_config(name, overrides=overrides, base=base)


class StopFlag:
    """Set by the first Ctrl-C or SIGTERM (or by the caller); the loop checks it
    between updates. `signal` names the signal that set it first, if one did. With
    `announce`, that first signal says on stderr what happens next (an update, or an
    env step that hangs, can take a while, and a silent Ctrl-C looks ignored)."""

    def __init__(self, announce: bool = False):
        self.requested = False
        self.signal: str | None = None
        self.announce = announce

    def __call__(self) -> bool:
        return self.requested


@dataclass(frozen=True)
class RunPlan:
    """A run, decided once before it starts and passed down (the CLI builds it):
    the resolved config, the run directory (None: a new name when the run starts,
    rank 0's for every rank), whether it resumes from the checkpoint there, whether
    a new run may move what the directory holds aside (run_dir.py), and this
    process's place among the ranks."""
    config: Config
    run_dir: Path | None = None
    resume: bool = False
    overwrite: bool = False
    place: distributed.Place = distributed.Place()


def train(config: Config, run_dir: str | os.PathLike[str] | None = None, resume: bool = False,
          progress: Callable[[dict], None] | bool | None = None, stop: StopFlag | None = None,
          on_start: Callable[[Path], None] | None = None, overwrite: bool = False) -> dict:
    """Trains until `total_steps`, `stop_return` or a stop request; returns a summary.

    `progress(record)` is called every `train.progress_interval` updates (`progress=True`
    prints `peregrine train`'s plain progress line then, as in a notebook);
    `on_start(run_dir)` once the run directory and its config exist.
    With `resume=True`, `run_dir` must hold a checkpoint to continue from; without
    it, `run_dir` must be new or empty unless `overwrite` (run_dir.py).
    """
    if not isinstance(config, Config):
        raise TypeError(f"train takes a Config, got {type(config).__name__} {config!r}"
                        + (f": train(load_config({config!r}))" if isinstance(config, str)
                           else ""))
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress is True (print progress lines), None or a function of "
                        f"the record, got {progress!r}")
    plan = RunPlan(config, None if run_dir is None else Path(run_dir), resume, overwrite,
                   distributed.place())
    return train_plan(plan, progress, stop, on_start)


def train_plan(plan: RunPlan, progress: Callable[[dict], None] | bool | None = None,
               stop: StopFlag | None = None,
               on_start: Callable[[Path], None] | None = None) -> dict:
    """`train` for a RunPlan (see train)."""
    if progress is True:
        progress = print_progress
    elif progress is False:
        progress = None
    if plan.place.launched:        # a rank never outlives the launcher that started it
        parent = os.getppid()
        die_with_parent(parent)
        watch_parent(parent)
    dist = distributed.DataParallel(plan.config) if plan.place.launched else None
    try:
        if dist is None:
            return _train(plan, progress, stop, on_start, dist)
        # torchrun's error file: the launcher's failure summary shows the traceback.
        from torch.distributed.elastic.multiprocessing.errors import record
        return record(_train)(plan, progress, stop, on_start, dist)
    except BaseException as error:
        if dist is not None and not isinstance(error, KeyboardInterrupt):
            dist.report_failure(error)
        raise
    finally:
        if dist is not None:
            dist.close()


def _on_main(dist, work):
    """`work()` on rank 0 (or the only process), its result (or its exception,
    raised) on every rank."""
    if dist is None:
        return work()
    result = error = None
    if dist.is_main:
        try:
            result = work()
        except Exception as caught:  # noqa: BLE001 - re-raised on every rank below
            error = caught
    result, error = dist.broadcast((result, error))
    if error is not None:
        raise error
    return result


def _claim(run_dir: Path, resume: bool, overwrite: bool) -> tuple[RunLock, bool]:
    """The run directory's lock, and whether to resume: a rank restarted by torchrun
    continues from the run's checkpoint if there is one (and never moves the run
    aside again); otherwise a new run claims the directory (run_dir.claim_new)."""
    if resume:
        return RunLock(run_dir), True
    if distributed.restart_count() > 0:
        if checkpoint_path(run_dir).is_file():
            return RunLock(run_dir), True
        return claim_new(run_dir), False     # crashed before its first checkpoint
    return claim_new(run_dir, overwrite), False


def _run_directory(plan: RunPlan, dist) -> Path:
    """The plan's run directory, or a new name (new_run_dir): rank 0's for every rank."""
    name = plan.run_dir
    if name is None and (dist is None or dist.is_main):
        name = new_run_dir(plan.config)
    if dist is not None:
        name = dist.broadcast(None if name is None else str(name))
    return Path(name)


def _train(plan: RunPlan, progress, stop, on_start, dist) -> dict:
    config, resume, overwrite = plan.config, plan.resume, plan.overwrite
    t = config.train
    main = dist is None or dist.is_main
    run_dir = _run_directory(plan, dist)
    # A new directory that this run made is removed again if the run fails before its
    # trainer exists (an env that cannot be made, a bad setting only the trainer sees):
    # a typo leaves no empty run behind. A directory that existed is left as it is.
    made_here = main and not resume and not run_dir.exists()
    lock = None

    def claim():
        nonlocal lock
        lock, resuming = _claim(run_dir, resume, overwrite)
        if not resuming:
            return None
        payload = checkpoint.load(checkpoint_path(run_dir))
        checkpoint.check_resume(payload, config)    # before config.toml is rewritten
        return payload

    trainer = logger = previous_handlers = None
    status = "crashed"
    try:
        payload = _on_main(dist, claim)
        resume = payload is not None
        if resume:
            state = distributed.local_state(payload, *((dist.rank, dist.world_size)
                                                       if dist else ()))
            payload = None
        if main:
            (run_dir / "config.toml").write_text(config.to_toml())
        stop = stop or StopFlag(announce=main)
        stopped = stop
        if dist is not None:    # every rank stops after the same update
            dist.stop_source = stop
            stopped = lambda: dist.stopping  # noqa: E731
        if t.overlap:    # rollouts from an actor process, one update ahead (overlap.py)
            from .overlap import OverlapTrainer
            trainer = OverlapTrainer(config, dist=dist)
        else:
            trainer = Trainer(config, dist=dist)
        previous_handlers = _install_stop_signals(stop)

        def save():
            state = trainer.state_dict()
            if dist is not None:
                state = dist.gather_state(state)
            if main:
                checkpoint.save(checkpoint_path(run_dir), state)

        if resume:
            trainer.load_state_dict(state)
            state = None
            if trainer.done:    # it would log "finished" again and train nothing
                raise ValueError(f"the run in {str(run_dir)!r} has trained "
                                 f"{trainer.global_step:,} steps and train.total_steps is "
                                 f"{t.total_steps:,}: nothing is left to train; resume with a "
                                 f"larger --total-steps")
        if main:
            # On resume the logs are cut back to the checkpoint: updates logged
            # after it are redone and logged again.
            logger = RunLogger(run_dir, trainer.stat_names, tensorboard=t.tensorboard,
                               world_size=trainer.world_size, config_toml=config.to_toml(),
                               track=t.track, config=config.to_dict(),
                               resume_from=(trainer.updates, trainer.global_step)
                               if resume else None)
            if on_start is not None:
                on_start(run_dir)
        solved_at = None
        while not trainer.done and not stopped():
            record = trainer.update()
            if logger is not None:
                logger.update(record)
            if progress is not None and main and (
                    trainer.updates % max(t.progress_interval, 1) == 0 or trainer.done):
                progress(record)
            if t.checkpoint_interval and trainer.updates % t.checkpoint_interval == 0:
                save()
            recent = record["recent_return"]
            if t.stop_return > 0 and recent is not None and recent >= t.stop_return:
                solved_at = record
                break
        save()
        status = "interrupted" if stopped() else "finished"
        return {
            "run_dir": str(run_dir), "status": status, "global_step": trainer.global_step,
            "updates": trainer.updates, "elapsed": trainer.elapsed,
            "sps": trainer.global_step / trainer.elapsed if trainer.elapsed else 0.0,
            "recent_return": trainer.recent_return(), "episodes": trainer.episodes,
            "stopped_at_return": solved_at is not None,
            "checkpoint": str(checkpoint_path(run_dir)),
            "signal": stop.signal if status == "interrupted" else None,
        }
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        _restore_stop_signals(previous_handlers)
        if logger is not None:
            logger.close(status)
            _plot_learning_curve(run_dir)
        if dist is not None:
            dist.stop_source = None
        if trainer is not None:
            trainer.close()
        if made_here and lock is not None and trainer is None and status == "crashed":
            shutil.rmtree(run_dir, ignore_errors=True)     # still under this run's lock
        if lock is not None:
            lock.release()


def _plot_learning_curve(run_dir) -> None:
    """learning_curve.png in the run directory; a plotting problem (no
    matplotlib, no finished episode yet) never fails the run."""
    try:
        from ..monitor.plots import plot_learning_curve
        plot_learning_curve(run_dir)
    except Exception as error:  # noqa: BLE001 - plotting is a courtesy
        import sys
        print(f"peregrine train: no learning curve: {error}", file=sys.stderr)


def _install_stop_signals(stop: StopFlag) -> dict | None:
    """Ctrl-C and SIGTERM request a stop after the current update (and a save).
    A second Ctrl-C stops at once (KeyboardInterrupt); SIGTERM never escalates.
    Returns the previous handlers (None off the main thread, where Python allows
    no handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        if signum == signal.SIGINT and stop.requested:
            raise KeyboardInterrupt
        if not stop.requested:
            stop.signal = signal.Signals(signum).name
            if stop.announce:
                again = "; Ctrl-C again stops at once" if signum == signal.SIGINT else ""
                try:    # os.write: no Python buffer or lock taken inside a signal handler
                    os.write(2, f"\n{stop.signal}: stopping after this update, then saving"
                                f"{again}\n".encode())
                except OSError:
                    pass
        stop.requested = True

    previous = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
    except ValueError:
        pass
    return previous


def _restore_stop_signals(previous: dict | None) -> None:
    for signum, handler in (previous or {}).items():
        signal.signal(signum, handler)


def exit_code(summary: dict) -> int:
    """The CLI's exit status for a run's summary: 0 finished, 130 stopped by Ctrl-C
    (or by the caller), 128 + N stopped by signal N (143 for SIGTERM)."""
    if summary["status"] != "interrupted":
        return 0
    name = summary.get("signal")
    return 128 + int(getattr(signal, name)) if name else 130


def print_progress(record: dict) -> None:
    print(format_progress(record), flush=True)


def format_progress(record: dict) -> str:
    """One plain progress line: steps, SPS, recent mean return (>= 20 episodes), this
    update's mean episode length, value loss and approximate KL."""
    ret = record.get("recent_return")
    ret_text = f"{'-':>8}" if ret is None else f"{ret:8.1f}"
    length = record.get("episode_length")
    len_text = f"{'-':>7}" if length is None else f"{length:7.1f}"
    losses = record["losses"]
    updates = f"{record['updates']}/{record['total_updates']}"
    return (f"update {updates:>9} | step {record['global_step']:>11,} | "
            f"{record['sps']:>10,.0f} SPS | recent return {ret_text} | length {len_text} | "
            f"value loss {losses['value_loss']:8.3f} | kl {losses['approx_kl']:.4f} | "
            f"{time.strftime('%H:%M:%S')}")
