"""A training run: its directory, the update loop, checkpoints, Ctrl-C.

Run directory (default runs/<env>-<UTC time>-s<seed>/):

    config.toml              the resolved configuration (read back by --resume)
    metrics.jsonl            one JSON record per update, then {"status": ...}
    metrics.bin              the live record the monitor reads (peregrine.monitor)
    learning_curve.png       episode return against steps, drawn when the run ends
    checkpoints/latest.pt    model, optimizer, RNG states, counters, config, env state
    tensorboard/             event files, when train.tensorboard is true

Checkpoints are taken only at update boundaries, every
`train.checkpoint_interval` updates, at the end and on Ctrl-C: the first
Ctrl-C lets the current update finish (a fraction of a second) and saves, so
`--resume` continues exactly; a second Ctrl-C stops at once.

Several ranks (torchrun, `peregrine train --nproc N`; see distributed.py): every
rank trains, rank 0 alone writes the run directory (its name is broadcast to the
others); Ctrl-C on the launcher reaches every rank, the ranks agree on the
update to stop after, and rank 0 saves once with every rank's state.
A resumed run first cuts metrics.jsonl and TensorBoard back to the
checkpoint's update (see metrics.RunLogger), since a crash may have logged
updates that are redone.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from . import checkpoint
from . import distributed
from .config import Config, load_config, read_toml
from .metrics import RunLogger
from .ppo import Trainer


def new_run_dir(config: Config) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    parent = Path(config.train.run_dir)
    base = f"{config.env_name}-{stamp}-s{config.train.seed}"
    path, suffix = parent / base, 1
    while path.exists():
        suffix += 1
        path = parent / f"{base}-{suffix}"
    return path


def checkpoint_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "checkpoints" / "latest.pt"


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
    """Set by the first Ctrl-C (or by the caller); the loop checks it between updates."""

    def __init__(self):
        self.requested = False

    def __call__(self) -> bool:
        return self.requested


def train(config: Config, run_dir: str | os.PathLike[str] | None = None, resume: bool = False,
          progress: Callable[[dict], None] | None = None, stop: StopFlag | None = None,
          on_start: Callable[[Path], None] | None = None) -> dict:
    """Trains until `total_steps`, `stop_return` or a stop request; returns a summary.

    `progress(record)` is called every `train.progress_interval` updates;
    `on_start(run_dir)` once the run directory and its config exist.
    With `resume=True`, `run_dir` must hold a checkpoint to continue from.
    """
    dist = distributed.DataParallel(config) if distributed.launched() else None
    try:
        if dist is None:
            return _train(config, run_dir, resume, progress, stop, on_start, dist)
        # torchrun's error file: the launcher's failure summary shows the traceback.
        from torch.distributed.elastic.multiprocessing.errors import record
        return record(_train)(config, run_dir, resume, progress, stop, on_start, dist)
    except BaseException as error:
        if dist is not None and not isinstance(error, KeyboardInterrupt):
            dist.report_failure(error)
        raise
    finally:
        if dist is not None:
            dist.close()


def _train(config, run_dir, resume, progress, stop, on_start, dist) -> dict:
    t = config.train
    main = dist is None or dist.is_main
    if dist is not None:    # rank 0 names the run directory
        run_dir = dist.broadcast(None if run_dir is None else str(run_dir))
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(config)
    if resume:
        state = distributed.local_state(checkpoint.load(checkpoint_path(run_dir)),
                                        *((dist.rank, dist.world_size) if dist else ()))
    elif main:
        run_dir.mkdir(parents=True, exist_ok=True)
    if main:
        (run_dir / "config.toml").write_text(config.to_toml())
    stop = stop or StopFlag()
    stopped = stop
    if dist is not None:    # every rank stops after the same update
        dist.stop_source = stop
        stopped = lambda: dist.stopping  # noqa: E731
    if t.overlap:    # rollouts from an actor process, one update ahead (overlap.py)
        from .overlap import OverlapTrainer
        trainer = OverlapTrainer(config, dist=dist)
    else:
        trainer = Trainer(config, dist=dist)
    logger = None
    status = "crashed"
    previous_handler = _install_sigint(stop)

    def save():
        state = trainer.state_dict()
        if dist is not None:
            state = dist.gather_state(state)
        if main:
            checkpoint.save(checkpoint_path(run_dir), state)

    try:
        if resume:
            trainer.load_state_dict(state)
        if main:
            # On resume the logs are cut back to the checkpoint: updates logged
            # after it are redone and logged again.
            logger = RunLogger(run_dir, trainer.stat_names, tensorboard=t.tensorboard,
                               world_size=trainer.world_size, config_toml=config.to_toml(),
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
        }
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        _restore_sigint(previous_handler)
        if logger is not None:
            logger.close(status)
            _plot_learning_curve(run_dir)
        if dist is not None:
            dist.stop_source = None
        trainer.close()


def _plot_learning_curve(run_dir) -> None:
    """learning_curve.png in the run directory; a plotting problem (no
    matplotlib, no finished episode yet) never fails the run."""
    try:
        from ..monitor.plots import plot_learning_curve
        plot_learning_curve(run_dir)
    except Exception as error:  # noqa: BLE001 - plotting is a courtesy
        import sys
        print(f"peregrine train: no learning curve: {error}", file=sys.stderr)


def _install_sigint(stop: StopFlag):
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True

    try:
        return signal.signal(signal.SIGINT, handler)
    except ValueError:
        return None


def _restore_sigint(previous):
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


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
            f"{record['sps']:>10,.0f} SPS | return {ret_text} | length {len_text} | "
            f"value loss {losses['value_loss']:8.3f} | kl {losses['approx_kl']:.4f} | "
            f"{time.strftime('%H:%M:%S')}")
