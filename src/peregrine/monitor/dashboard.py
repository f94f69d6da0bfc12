"""The dashboard: a Rich renderable built from one metrics snapshot.

Rendering is a pure function of (header, latest record, history, liveness),
so the live view, `--once` and the tests all draw the same frame.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .metrics import LOSS_NAMES, Header, MetricsReader, Record

SPARK_CHARS = "▁▂▃▄▅▆▇█"
LIVENESS_STYLES = {
    "running": ("RUNNING", "bold green"),
    "starting": ("STARTING", "bold cyan"),
    "finished": ("FINISHED", "bold blue"),
    "interrupted": ("INTERRUPTED", "bold yellow"),
    "crashed": ("CRASHED", "bold red"),
    "stale": ("STALE - trainer process is gone", "bold red"),
    "silent": ("SILENT - no update recently", "bold yellow"),
}


@dataclass
class Snapshot:
    """Everything one frame shows."""

    header: Header
    record: Record | None
    history: list[Record]
    liveness: str
    now: float

    @classmethod
    def take(cls, reader: MetricsReader, history: int = 60, stale_after: float = 10.0) -> "Snapshot":
        record = reader.read()
        return cls(reader.header, record, reader.history(history),
                   reader.liveness(record, stale_after), time.time())


def sparkline(values, width: int = 24) -> str:
    """Unicode bars for the last `width` finite values ('' if none)."""
    finite = [v for v in values if v == v and not math.isinf(v)][-width:]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    if high == low:
        return SPARK_CHARS[3] * len(finite)
    scale = (len(SPARK_CHARS) - 1) / (high - low)
    return "".join(SPARK_CHARS[int(round((v - low) * scale))] for v in finite)


def number(value: float, digits: int = 4) -> str:
    """A compact human number; '-' for NaN (a value the trainer never sent)."""
    if value is None or value != value:
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-3 or magnitude >= 1e7):
        return f"{value:.2e}"
    if float(value).is_integer() and magnitude >= 1000:
        return f"{int(value):,}"
    return f"{value:,.{digits}g}" if magnitude < 1000 else f"{value:,.1f}"


def duration(seconds: float) -> str:
    if seconds != seconds or seconds < 0:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class Row:
    """One line of a panel: a label, a number, and after them, space allowing, a
    sparkline of `spark`, a bar `bar` (a share in [0, 1]) or the first of `notes`
    (longest first) that fits."""

    label: str
    value: str
    spark: list | None = None
    bar: float | None = None
    notes: tuple[str, ...] = ()


SPARK_MAX = 24     # sparkline characters at most
BAR_MAX = 20       # characters of a time-split bar at 100%
EXTRA_MIN = 6      # narrower than this, sparklines and bars are left out
CELL_GAP = 2       # columns between label, value and extra
PANEL_GAP = 4      # columns between the two columns of panels


def megabytes(value: float) -> str:
    if value != value:
        return "-"
    return f"{value / 1024:.2f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def resources_rows(value: dict, series) -> list[Row]:
    """Memory, CPU, GPU and time to first result, as the trainer recorded them
    (train/resources.py); '-' where the record has none (a file written before
    these fields existed, no GPU, a platform that does not tell)."""
    nan = math.nan
    peak, total = value.get("peak_rss_mb", nan), value.get("peak_rss_total_mb", nan)
    rows = [Row("peak RSS", megabytes(peak),
                spark=series("peak_rss_mb") if "peak_rss_mb" in value else None)]
    if total == total and peak == peak and total > peak:
        rows.append(Row("all processes", megabytes(total),
                        notes=("sum of each process's peak", "sum of peaks")))
    cpu = value.get("cpu_percent", nan)
    rows.append(Row("CPU", "-" if cpu != cpu else f"{cpu:.0f}%",
                    spark=series("cpu_percent") if "cpu_percent" in value else None))
    gpu, gpu_memory = value.get("gpu_util_percent", nan), value.get("gpu_memory_mb", nan)
    if gpu == gpu or gpu_memory == gpu_memory:
        rows.append(Row("GPU", "-" if gpu != gpu else f"{gpu:.0f}%",
                        spark=series("gpu_util_percent")))
        rows.append(Row("GPU memory", megabytes(gpu_memory)))
    first = value.get("time_to_first_result", nan)
    rows.append(Row("first result", "-" if first != first else f"{first:.1f} s",
                    notes=("after start",)))
    return rows


def _fixed_width(rows: list[Row]) -> int:
    """Columns that a panel's labels and values take, gaps included."""
    return max(cell_len(r.label) for r in rows) + CELL_GAP + max(cell_len(r.value) for r in rows)


def _has_extra(rows: list[Row]) -> bool:
    return any(r.spark is not None or r.bar is not None or r.notes for r in rows)


def _table(title: str, rows: list[Row], width: int) -> Table:
    """A panel laid out to fit `width` columns: labels and values whole (a label
    wraps only if it alone is wider than the panel), the sparkline, bar or note
    after them shortened or left out to fit."""
    extra = width - _fixed_width(rows) - CELL_GAP
    table = Table.grid(padding=(0, CELL_GAP))
    table.add_column(style="dim", overflow="fold")     # folds rather than pushing numbers out
    table.add_column(justify="right", no_wrap=True)
    table.add_column(style="cyan", no_wrap=True)
    table.title = title
    table.title_style = "bold"
    for row in rows:
        shown = ""
        if row.spark is not None and extra >= EXTRA_MIN:
            shown = sparkline(row.spark, min(SPARK_MAX, extra))
        elif row.bar is not None and extra >= EXTRA_MIN:
            shown = "█" * int(round(row.bar * min(BAR_MAX, extra)))
        elif row.notes:
            shown = next((note for note in row.notes if cell_len(note) <= extra), "")
        table.add_row(row.label, row.value, shown)
    return table


def layout(panels: list[tuple[str, list[Row]]], width: int):
    """The panels in two columns, in reading order, when every panel fits half of
    `width` (wide terminals); otherwise one column, each panel the full width."""
    inner = width - 4                            # the frame's borders and padding
    half = (inner - PANEL_GAP) // 2
    fits = all(_fixed_width(rows) + (CELL_GAP + EXTRA_MIN if _has_extra(rows) else 0) <= half
               and cell_len(title) <= half for title, rows in panels)
    if not fits:
        parts = []
        for title, rows in panels:
            parts += [_table(title, rows, inner), Text("")]
        return Group(*parts[:-1])
    grid = Table.grid(padding=(0, PANEL_GAP))
    for i in range(0, len(panels), 2):
        pair = [_table(title, rows, half) for title, rows in panels[i:i + 2]]
        if i:
            grid.add_row(Text(""), Text(""))
        grid.add_row(*pair)
    return grid


def render(snapshot: Snapshot, width: int = 100):
    """The frame for one snapshot, as a Rich renderable, laid out for `width` columns."""
    header, record, history = snapshot.header, snapshot.record, snapshot.history
    label, style = LIVENESS_STYLES.get(snapshot.liveness, (snapshot.liveness.upper(), "bold"))
    title = Text.assemble(("Peregrine ", "bold magenta"), (f"run {header.run_id}  ", "bold"), (label, style))
    ranks = f"  {header.world_size} ranks (global SPS)" if header.world_size > 1 else ""
    facts = Text(f"pid {header.pid} on {header.host or '?'}{ranks}  started "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(header.start_time))}", style="dim")
    lead = []
    if title.cell_len > width - 6:
        # A title wider than the frame's top edge would be cut: it opens the body instead.
        lead, title = [title], None
    if record is None:
        body = Text("waiting for the first update...", style="italic")
        return Panel(Group(*lead, facts, body), title=title, title_align="left")

    value = record.values
    age = snapshot.now - value["heartbeat"]
    facts.append(f"  heartbeat {age:.1f} s ago")

    def series(name):
        return [r.values[name] for r in history]

    throughput = [Row("SPS", number(value["sps"]), spark=series("sps")),
                  Row("steps", number(value["global_step"])),
                  Row("updates", number(value["updates"])),
                  Row("elapsed", duration(value["elapsed"]))]
    total = header.total_steps
    if total:       # progress toward the budget, and the time left at the current SPS
        done = value["global_step"]
        throughput[1] = Row("steps", f"{number(done)} / {number(total)}",
                            bar=min(done / total, 1.0))
        if snapshot.liveness == "running" and value["sps"] == value["sps"] \
                and value["sps"] > 0 and done < total:
            throughput.append(Row("left", duration((total - done) / value["sps"])))

    def latest(name):
        """This update's value, or, when no episode ended in it (long episodes
        near the end of training), the last one that did, marked with '*'."""
        if value[name] == value[name]:
            return number(value[name])
        earlier = [v for v in series(name) if v == v]
        return f"{number(earlier[-1])}*" if earlier else "-"

    episodes = [Row("finished", number(value["episodes"])),
                Row("return", latest("episode_return"), spark=series("episode_return")),
                Row("length", latest("episode_length"), spark=series("episode_length"))]

    losses = [Row(name.replace("_", " "), number(value[name])) for name in LOSS_NAMES]

    split = []
    parts = {"env": value["time_env"], "forward": value["time_forward"], "learn": value["time_learn"]}
    total = sum(v for v in parts.values() if v == v)
    for name, seconds in parts.items():
        if seconds == seconds and total > 0:
            share = seconds / total
            split.append(Row(name, f"{share:6.1%}", bar=share))
        else:
            split.append(Row(name, "-"))
    # train.overlap: env and forward ran in the actor process, partly beside learning.
    hidden = value.get("time_overlap", math.nan)
    rollout = parts["env"] + parts["forward"]
    if hidden == hidden and rollout > 0:
        share = min(hidden / rollout, 1.0)
        split.append(Row("overlapped", f"{share:6.1%}",
                         notes=("of env+forward ran beside learn", "of env+forward")))

    # Return and length are already under Episodes; show them here only if
    # the trainer sent a value for them that the Episodes panel lacks.
    shown = {name: stat for name, stat in record.env_stats.items()
             if not (name in ("episode_return", "episode_length") and stat != stat)}
    env_stats = [Row(name, number(stat)) for name, stat in shown.items()] or [Row("(none)", "")]

    panels = [("Throughput", throughput), ("Episodes", episodes), ("Losses", losses),
              ("Time split", split), ("Env stats", env_stats),
              ("Resources", resources_rows(value, series))]
    return Panel(Group(*lead, facts, Text(""), layout(panels, width)), title=title,
                 title_align="left")


def render_text(snapshot: Snapshot, width: int = 100) -> str:
    """One frame as plain text (no colour codes): for `--once`, tests, the README."""
    console = Console(width=width, color_system=None, force_terminal=False, legacy_windows=False)
    with console.capture() as capture:
        console.print(render(snapshot, width))
    return capture.get()
