"""--train.track wandb: an offline Weights & Biases run writes the run's records and
its resolved config under RUN_DIR/wandb."""
from __future__ import annotations

import json

import pytest

wandb = pytest.importorskip("wandb")

from peregrine.train.config import load_config  # noqa: E402
from peregrine.train.run_log import flat_numbers  # noqa: E402
from peregrine.train.run import train  # noqa: E402
from polling import poll_until  # noqa: E402


def test_offline_wandb_run_writes_records_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):   # not ~/
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    config = load_config("cartpole", overrides=[
        ("train.track", "wandb"), ("train.total_steps", 2048), ("vec.num_envs", 16),
        ("train.horizon", 32), ("train.stop_return", 0.0), ("train.tensorboard", False),
        ("train.learning_rate", 1.25e-3)])
    run_dir = tmp_path / "run"
    summary = train(config, run_dir)
    assert summary["status"] == "finished"
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    run_id = (run_dir / "wandb" / "peregrine-run-id").read_text().strip()
    keys = ("losses/value_loss", "time_split/env", "sps", "global_step")
    data = _written(runs[0] / f"run-{run_id}.wandb", [k.encode() for k in keys])
    # The same records as metrics.jsonl: every flattened key of the last record...
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "global_step" in r][-1]
    for key in keys:
        assert key in flat_numbers(last) and key.encode() in data
    # ...and the resolved config (a value of this run's own).
    assert b"learning_rate" in data and b"0.00125" in data


def _written(path, needles, timeout=30.0):
    """The file once it holds every needle (or its bytes at the timeout): wandb-core's
    writer can still be flushing the .wandb file when run.finish() returns (once seen
    under load: 7 header bytes at the read, 11 kB a moment later)."""
    poll_until(lambda: all(needle in path.read_bytes() for needle in needles), timeout)
    return path.read_bytes()


def test_track_is_checked_by_the_config():
    with pytest.raises(ValueError, match=r"train.track = 'mlflow' is not one of \['none', 'wandb'\]"):
        load_config("cartpole", overrides=[("train.track", "mlflow")])


def test_flat_numbers_joins_nested_keys_and_drops_the_rest():
    record = {"sps": 10.0, "updates": 3, "recent_return": None, "done": True, "name": "x",
              "losses": {"value_loss": 0.5, "approx_kl": 0.01}, "resources": {"gpu": None}}
    assert flat_numbers(record) == {"sps": 10.0, "updates": 3, "losses/value_loss": 0.5,
                                    "losses/approx_kl": 0.01}


def test_a_tracked_attempt_without_a_checkpoint_is_still_an_attempt(tmp_path):
    """A tracked run that died before its first checkpoint leaves wandb/ beside its
    other files: rerunning the same command clears it like any attempt."""
    from peregrine.train.run_dir import describe
    (tmp_path / "config.toml").write_text("")
    (tmp_path / "wandb" / "offline-run-1").mkdir(parents=True)
    (tmp_path / "wandb" / "offline-run-1" / "run-1.wandb").write_text("x")
    assert describe(tmp_path) == "attempt"
    (tmp_path / "notes.txt").write_text("mine")
    assert describe(tmp_path) == "other"
