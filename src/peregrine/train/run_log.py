"""Where a run's numbers go: metrics.jsonl always, the dashboard writer and
TensorBoard when installed.

`metrics.jsonl` in the run directory gets one JSON object per update (the
trainer's own record, read by the benchmarks and tests). When
`peregrine.monitor` is installed its `MetricsWriter` is fed too, so a
`peregrine monitor RUN_DIR` dashboard can attach; a failure there disables it
with a warning and never stops training. TensorBoard event files go to
RUN_DIR/tensorboard when `train.tensorboard` is true (the default) and
tensorboard is installed; when it is not, a notice says so once per machine
(a marker file in Peregrine's cache folder), not on every run.

A record's `time_split` holds the update's seconds by phase: `env` (waiting for env
steps), `forward` (the rest of the rollout: policy forward, sampling, storage
writes, bootstraps, GAE) and `learn` (the PPO epochs). On the synchronous path
`env` is the whole env step. With `vec.split = 2` (train/collect.py) a half's env
step runs on a worker thread beside the other half's forward, and `env` is only
the time the trainer WAITED for it: the overlapped part is hidden, and reported
beside the three as `env_hidden` (not in their sum, not on the dashboard). With
`train.overlap`, `wait` and `overlap` are added likewise (train/overlap.py).

A record's `resources` holds what the run costs the machine, sampled once per
update (train/resources.py): peak resident memory of the trainer and of every
process it started (and of every rank), CPU utilisation, on CUDA the GPU's
utilisation and memory through NVML, and `time_to_first_result` (process start
to the first update's record). They reach the dashboard through the same
MetricsWriter record, so the monitor never polls the trainer.

With `train.track = "wandb"` the same records (flattened: losses/policy_loss,
env_stats/delivered, ...) go to Weights & Biases at step = global_step, with the
resolved config as the run's config; its files are in RUN_DIR/wandb. It runs
offline (files only, `wandb sync` uploads them later) when WANDB_MODE=offline or
no API key is set up (WANDB_API_KEY or `wandb login`); WANDB_PROJECT names the
project (default "peregrine"). A resumed run continues the same W&B run (its id
is kept in RUN_DIR/wandb/peregrine-run-id). Asked for and not installed, it is
an error before the first update; failing later, it is disabled with a warning.

Resuming (`resume_from=(updates, global_step)` of the checkpoint): a run
killed after its last checkpoint has already logged the updates it is about
to redo, so the logs are first cut back to the checkpoint. metrics.jsonl loses
every line from the first record past the checkpoint's update (and a last line
a crash cut short); TensorBoard gets `purge_step` = the checkpoint's
global_step + 1, which hides the events logged after it from TensorBoard's
readers. The learning curve is drawn from the cut metrics.jsonl.
"""
from __future__ import annotations

import json
import netrc
import os
import secrets
import sys
from pathlib import Path


def cut_jsonl(path, updates: int) -> int:
    """Cuts metrics.jsonl back to the checkpoint of update `updates`; returns the
    number of bytes removed.

    Keeps every line before the first record whose "updates" exceeds `updates`
    (status lines of earlier segments included) and drops that record, all
    after it, and a last line without its newline (a write a crash cut short).
    """
    path = Path(path)
    if not path.is_file():
        return 0
    keep = 0
    with open(path, "rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict) and isinstance(record.get("updates"), int) \
                    and record["updates"] > updates:
                break
            keep += len(line)
        size = handle.seek(0, 2)
    if keep < size:
        with open(path, "r+b") as handle:
            handle.truncate(keep)
    return size - keep


# In Peregrine's cache folder: present once the TensorBoard notice has been shown.
TENSORBOARD_NOTICE_MARKER = "tensorboard-notice-shown"


def first_tensorboard_notice() -> bool:
    """True the first time it is asked on this machine (it leaves a marker file in
    the cache folder, $PEREGRINE_CACHE or ~/.cache/peregrine), False after. An
    unwritable cache folder cannot remember: True, so the notice is never lost."""
    from ..envs.sdk import cache_dir          # <cache>/native: the folder's one definition
    marker = cache_dir().parent / TENSORBOARD_NOTICE_MARKER
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        with open(marker, "x"):               # exclusive create: one process wins
            pass
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


class RunLogger:
    def __init__(self, run_dir, env_stat_names, tensorboard: bool = False, dashboard: bool = True,
                 world_size: int = 1, resume_from: tuple[int, int] | None = None,
                 config_toml: str | None = None, track: str = "none",
                 config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_from is not None:
            cut_jsonl(self.run_dir / "metrics.jsonl", resume_from[0])
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        try:
            self.jsonl = open(self.jsonl_path, "a", buffering=1)
        except OSError as error:
            raise self._write_error(error) from None
        self.writer = None
        if dashboard:
            from ..monitor.metrics import MetricsWriter
            try:
                self.writer = MetricsWriter(self.run_dir, [
                    name for name in env_stat_names
                    if name not in ("episode_return", "episode_length")],
                    world_size=world_size, warn=self._warn,
                    total_steps=(config or {}).get("train", {}).get("total_steps"))
            except Exception as error:  # noqa: BLE001 - the dashboard is optional
                self._warn(f"dashboard metrics disabled: {error}")
        self.tensorboard = None
        if tensorboard:
            self.tensorboard = self._open_tensorboard(resume_from, config_toml)
        self.wandb = self._open_wandb(resume_from, config) if track == "wandb" else None

    def _open_tensorboard(self, resume_from, config_toml):
        """TensorBoard's writer, with the run's resolved config as text; None (and a
        one-line notice) when tensorboard is not installed."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if first_tensorboard_notice():
                self._warn("TensorBoard event files skipped: tensorboard is not installed "
                           "(pip install tensorboard; --train.tensorboard false silences "
                           "this; shown once on this machine)")
            return None
        try:
            purge_step = None if resume_from is None else resume_from[1] + 1
            writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge_step)
            if config_toml is not None and resume_from is None:
                # TensorBoard's text plugin renders Markdown: a code block keeps the TOML.
                writer.add_text("hyperparameters", "```toml\n" + config_toml + "\n```", 0)
            return writer
        except Exception as error:  # noqa: BLE001
            self._warn(f"TensorBoard logging disabled: {error}")
            return None

    def _open_wandb(self, resume_from, config):
        """A Weights & Biases run in RUN_DIR/wandb (online with an API key, else
        offline), continued on resume; wandb not installed raises (it was asked for)."""
        import wandb
        folder = self.run_dir / "wandb"
        folder.mkdir(exist_ok=True)
        id_file = folder / "peregrine-run-id"
        if resume_from is not None and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(6)      # W&B run ids: lowercase letters and digits
            id_file.write_text(run_id + "\n")
        mode = "online" if os.environ.get("WANDB_MODE", "") != "offline" and \
            _wandb_api_key_set() else "offline"
        try:
            return wandb.init(project=os.environ.get("WANDB_PROJECT", "peregrine"),
                              name=self.run_dir.name, id=run_id, resume="allow",
                              dir=str(self.run_dir), config=config, mode=mode,
                              # the run's output stays the terminal's (and the dashboard's)
                              settings=wandb.Settings(console="off"))
        except Exception as error:  # noqa: BLE001 - tracking never stops training
            self._warn(f"W&B tracking disabled: {error}")
            return None

    @staticmethod
    def _warn(message: str) -> None:
        print(f"peregrine train: warning: {message}", file=sys.stderr)

    def _write_error(self, error: OSError) -> OSError:
        """`error` (a full or read-only disk, say) naming the metrics file."""
        return OSError(error.errno, f"cannot write metrics {str(self.jsonl_path)!r}: "
                                    f"{error.strerror or error}")

    def _write_line(self, record: dict) -> None:
        try:
            self.jsonl.write(json.dumps(record) + "\n")
        except OSError as error:
            raise self._write_error(error) from None

    def update(self, record: dict) -> None:
        self._write_line(record)
        if self.writer is not None:
            try:
                self.writer.update(
                    global_step=record["global_step"], updates=record["updates"],
                    sps=record["sps"], elapsed=record["elapsed"], episodes=record["episodes"],
                    episode_return=record.get("episode_return"),
                    episode_length=record.get("episode_length"),
                    env_stats=record.get("env_stats", {}), losses=record["losses"],
                    time_split=record["time_split"], status="running",
                    resources=record.get("resources"))
            except Exception as error:  # noqa: BLE001
                self._warn(f"dashboard metrics disabled: {error}")
                self.writer = None
        if self.tensorboard is not None:
            step = record["global_step"]
            scalars = {"charts/sps": record["sps"]}
            if record.get("episode_return") is not None:
                scalars["charts/episode_return"] = record["episode_return"]
                scalars["charts/episode_length"] = record["episode_length"]
            scalars.update({f"env/{k}": v for k, v in record.get("env_stats", {}).items()})
            scalars.update({f"losses/{k}": v for k, v in record["losses"].items()})
            scalars.update({f"time/{k}": v for k, v in record["time_split"].items()})
            scalars.update({f"resources/{k}": v for k, v in record.get("resources", {}).items()
                            if isinstance(v, (int, float))})
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, value, step)
        if self.wandb is not None:
            try:
                self.wandb.log(flat_numbers(record), step=record["global_step"])
            except Exception as error:  # noqa: BLE001
                self._warn(f"W&B tracking disabled: {error}")
                self.wandb = None

    def close(self, status: str) -> None:
        try:
            self._write_line({"status": status})
        finally:
            try:
                self.jsonl.close()
            except OSError:
                pass    # the failed write above (or its flush) already said why
        if self.writer is not None:
            try:
                self.writer.close(status=status)
            except Exception as error:  # noqa: BLE001
                self._warn(f"dashboard writer failed to close: {error}")
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            try:
                self.wandb.summary["status"] = status
                self.wandb.finish(exit_code=0 if status in ("finished", "interrupted") else 1)
            except Exception as error:  # noqa: BLE001
                self._warn(f"W&B run failed to close: {error}")


def flat_numbers(record: dict, prefix: str = "") -> dict[str, float]:
    """A record's numbers with nested keys joined by "/" (losses/value_loss);
    None, text and lists are left out."""
    flat = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_numbers(value, name + "/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = value
    return flat


def _wandb_api_key_set() -> bool:
    """Whether W&B has an API key here: WANDB_API_KEY, or `wandb login`'s netrc entry."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].rstrip("/")
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
