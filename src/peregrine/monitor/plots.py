"""The learning-curve PNG written into a run directory when training ends.

Reads the trainer's ``run_dir/metrics.jsonl`` (one JSON object per update
with at least ``global_step`` and ``episode_return``; lines without a
``global_step``, such as the closing ``{"status": ...}``, and lines a crash
cut short are skipped) and draws episode return, and episode length and SPS
where present, against env steps.

Drawn with Pillow's ImageDraw rather than Matplotlib: the figure is a few
lines and ticks, and importing and rendering with Matplotlib cost about as
long as a CartPole run trains (benchmarks/bench_cold_start.py), at the end of
every run. No display is needed.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

PNG_NAME = "learning_curve.png"
WIDTH, PANEL_HEIGHT, TITLE_HEIGHT, AXIS_LABEL_HEIGHT = 700, 240, 36, 24
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 72, 18, 26, 22
LINE, FAINT_LINE, GRID, AXIS, TEXT, MUTED = ((31, 119, 180), (199, 221, 236), (230, 230, 230),
                                             (90, 90, 90), (20, 20, 20), (128, 128, 128))


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


def episode_bins(records, key: str, width: int, min_episodes: int = 1):
    """[(last global_step of the bin, mean, episodes)] of `key` over the episodes
    that ended in each `width`-step bin: each update's value (a top-level field
    such as ``episode_length``, or an ``env_stats`` entry such as ``delivered``) is
    weighted by ``episodes_this_update``; bins of fewer than `min_episodes`
    episodes are left out. Per-update means are noisy where few episodes end in an
    update (DroneSwarm's fixed-length episodes end together), bins are not."""
    bins: dict = {}
    for record in records:
        count = record.get("episodes_this_update") or 0
        value = record.get(key, (record.get("env_stats") or {}).get(key))
        if count and isinstance(value, (int, float)) and math.isfinite(value):
            pool = bins.setdefault(int(record["global_step"]) // width, [0.0, 0, 0])
            pool[0] += value * count
            pool[1] += count
            pool[2] = record["global_step"]
    return [(last, total / count, count) for total, count, last in
            (bins[index] for index in sorted(bins)) if count >= min_episodes]


def _smooth(values, window: int):
    """Trailing moving average (the raw curve is drawn faintly beside it)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values (1, 2 or 5 times a power of ten apart)
    covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def format_number(value: float) -> str:
    """Compact tick label: 0.25, 40, 1.5k, 2M."""
    magnitude = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _font(size: int):
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def _draw_panel(draw, box, steps, values, label, x_range, font, show_x_labels):
    left, top, right, bottom = box
    draw.text((left, top - 18), label, fill=TEXT, font=font)
    x_low, x_high = x_range
    if values:
        y_low, y_high = min(values), max(values)
        if y_high == y_low:
            y_low, y_high = y_low - 1.0, y_high + 1.0
        y_ticks = nice_ticks(y_low, y_high)
        y_low, y_high = min(y_ticks[0], y_low), max(y_ticks[-1], y_high)
    else:
        y_low, y_high, y_ticks = 0.0, 1.0, []

    def to_pixel(x, y):
        px = left + (x - x_low) / (x_high - x_low) * (right - left)
        py = bottom - (y - y_low) / (y_high - y_low) * (bottom - top)
        return px, py

    for tick in y_ticks:
        _, py = to_pixel(x_low, tick)
        draw.line([(left, py), (right, py)], fill=GRID)
        text = format_number(tick)
        draw.text((left - 6 - draw.textlength(text, font=font), py - 6), text, fill=TEXT, font=font)
    for tick in nice_ticks(x_low, x_high, count=7):
        if not x_low <= tick <= x_high:
            continue
        px, _ = to_pixel(tick, y_low)
        draw.line([(px, top), (px, bottom)], fill=GRID)
        if show_x_labels:
            text = format_number(tick)
            draw.text((px - draw.textlength(text, font=font) / 2, bottom + 4), text, fill=TEXT,
                      font=font)
    draw.rectangle(box, outline=AXIS)
    if not values:
        message = "no finished episodes yet"
        draw.text(((left + right - draw.textlength(message, font=font)) / 2, (top + bottom) / 2 - 6),
                  message, fill=MUTED, font=font)
        return
    window = max(1, len(values) // 20)
    if window > 1:
        draw.line([to_pixel(x, y) for x, y in zip(steps, values)], fill=FAINT_LINE, width=1)
    smooth = [to_pixel(x, y) for x, y in zip(steps, _smooth(values, window))]
    if len(smooth) == 1:
        px, py = smooth[0]
        draw.ellipse([(px - 2, py - 2), (px + 2, py + 2)], fill=LINE)
    else:
        draw.line(smooth, fill=LINE, width=2, joint="curve")


def plot_learning_curve(run_dir, output=None, title: str | None = None) -> Path:
    """Draws ``run_dir/learning_curve.png`` (or `output`) and returns its path.

    Raises FileNotFoundError if the run has no metrics.jsonl. A run with no
    finished episodes still gets a figure, saying so.
    """
    from PIL import Image, ImageDraw

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

    height = TITLE_HEIGHT + PANEL_HEIGHT * len(panels) + AXIS_LABEL_HEIGHT
    image = Image.new("RGB", (WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    font, title_font = _font(12), _font(15)
    all_steps = [record["global_step"] for record in records] or [0]
    x_range = (min(all_steps), max(all_steps))
    if x_range[1] <= x_range[0]:
        x_range = (x_range[0], x_range[0] + 1)
    heading = title or f"{run_dir.name}: learning curve"
    draw.text(((WIDTH - draw.textlength(heading, font=title_font)) / 2, 10), heading, fill=TEXT,
              font=title_font)
    for index, (key, label) in enumerate(panels):
        top = TITLE_HEIGHT + index * PANEL_HEIGHT + MARGIN_TOP
        box = (MARGIN_LEFT, top, WIDTH - MARGIN_RIGHT, top + PANEL_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM)
        steps, values = _series(records, key)
        _draw_panel(draw, box, steps, values, label, x_range, font,
                    show_x_labels=index == len(panels) - 1)
    x_label = "env steps"
    draw.text(((WIDTH - draw.textlength(x_label, font=font)) / 2, height - AXIS_LABEL_HEIGHT + 4),
              x_label, fill=TEXT, font=font)
    path = Path(output) if output is not None else run_dir / PNG_NAME
    from ..files import written_atomically
    with written_atomically(path) as temporary:   # an interrupted write keeps the old file
        image.save(temporary, format="PNG")
    return path
