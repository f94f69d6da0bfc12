"""The learning-curve PNG written into a run directory when training ends.

Reads the trainer's ``run_dir/metrics.jsonl`` (one JSON object per update
with at least ``global_step`` and ``episode_return``; lines without a
``global_step``, such as the closing ``{"status": ...}``, and lines a crash
cut short are skipped) and draws episode return, and episode length and SPS
where present, against env steps. Uses Matplotlib's Agg canvas directly, so
it never touches pyplot's global backend state and works without a display.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

PNG_NAME = "learning_curve.png"


def read_jsonl(path) -> list[dict]:
    """The records of a metrics.jsonl that carry a global_step."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if isinstance(record, dict) and isinstance(record.get("global_step"), (int, float)):
                records.append(record)
    return records


def _series(records, key):
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(record["global_step"])
            values.append(value)
    return steps, values


def _smooth(values, window: int):
    """Trailing moving average (the raw curve is drawn faintly beside it)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_learning_curve(run_dir, output=None, title: str | None = None) -> Path:
    """Draws ``run_dir/learning_curve.png`` (or `output`) and returns its path.

    Raises FileNotFoundError if the run has no metrics.jsonl. A run with no
    finished episodes still gets a figure, saying so.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    source = run_dir / "metrics.jsonl"
    if not source.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir} (not a training run directory?)")
    records = read_jsonl(source)
    panels = [("episode_return", "episode return")]
    if _series(records, "episode_length")[0]:
        panels.append(("episode_length", "episode length"))
    if _series(records, "sps")[0]:
        panels.append(("sps", "steps / s"))

    figure = Figure(figsize=(7, 2.4 * len(panels) + 0.6), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for axis, (key, label) in zip(axes, panels):
        steps, values = _series(records, key)
        if steps:
            window = max(1, len(values) // 20)
            if window > 1:
                axis.plot(steps, values, color="tab:blue", alpha=0.25, linewidth=1)
            axis.plot(steps, _smooth(values, window), color="tab:blue", linewidth=1.8)
        else:
            axis.text(0.5, 0.5, "no finished episodes yet", transform=axis.transAxes,
                      ha="center", va="center", color="gray")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    axes[-1].set_xlabel("env steps")
    figure.suptitle(title or f"{run_dir.name}: learning curve")
    path = Path(output) if output is not None else run_dir / PNG_NAME
    figure.savefig(path)
    return path
