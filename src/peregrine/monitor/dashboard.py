"""The dashboard: a Rich renderable built from one metrics snapshot.

Rendering is a pure function of (header, latest record, history, liveness),
so the live view, `--once` and the tests all draw the same frame.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

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


def _table(title: str) -> Table:
    table = Table.grid(padding=(0, 2))
    table.min_width = 30
    table.add_column(style="dim", no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(style="cyan", no_wrap=True)
    table.title = title
    table.title_style = "bold"
    return table


def megabytes(value: float) -> str:
    if value != value:
        return "-"
    return f"{value / 1024:.2f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def resources_table(value: dict, series, spark: int) -> Table:
    """Memory, CPU, GPU and time to first result, as the trainer recorded them
    (train/resources.py); '-' where the record has none (a file written before
    these fields existed, no GPU, a platform that does not tell)."""
    nan = math.nan
    table = _table("Resources")
    peak, total = value.get("peak_rss_mb", nan), value.get("peak_rss_total_mb", nan)
    table.add_row("peak RSS", megabytes(peak), sparkline(series("peak_rss_mb"), spark)
                  if "peak_rss_mb" in value else "")
    if total == total and peak == peak and total > peak:
        table.add_row("all processes", megabytes(total), "sum of each process's peak")
    cpu = value.get("cpu_percent", nan)
    table.add_row("CPU", "-" if cpu != cpu else f"{cpu:.0f}%",
                  sparkline(series("cpu_percent"), spark) if "cpu_percent" in value else "")
    gpu, gpu_memory = value.get("gpu_util_percent", nan), value.get("gpu_memory_mb", nan)
    if gpu == gpu or gpu_memory == gpu_memory:
        table.add_row("GPU", "-" if gpu != gpu else f"{gpu:.0f}%",
                      sparkline(series("gpu_util_percent"), spark))
        table.add_row("GPU memory", megabytes(gpu_memory), "")
    first = value.get("time_to_first_result", nan)
    table.add_row("first result", "-" if first != first else f"{first:.1f} s", "after start")
    return table


def render(snapshot: Snapshot, width: int = 100):
    """The frame for one snapshot, as a Rich renderable, laid out for `width` columns."""
    header, record, history = snapshot.header, snapshot.record, snapshot.history
    label, style = LIVENESS_STYLES.get(snapshot.liveness, (snapshot.liveness.upper(), "bold"))
    title = Text.assemble(("Peregrine ", "bold magenta"), (f"run {header.run_id}  ", "bold"), (label, style))
    ranks = f"  {header.world_size} ranks (global SPS)" if header.world_size > 1 else ""
    facts = Text(f"pid {header.pid} on {header.host or '?'}{ranks}  started "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(header.start_time))}", style="dim")
    if record is None:
        body = Text("waiting for the first update...", style="italic")
        return Panel(Group(facts, body), title=title, title_align="left")

    value = record.values
    age = snapshot.now - value["heartbeat"]
    facts.append(f"  heartbeat {age:.1f} s ago")

    def series(name):
        return [r.values[name] for r in history]

    # Two columns of (label, value, sparkline) side by side inside the panel:
    # the sparklines get what is left after labels and values (~50 columns).
    spark = max(6, min(24, (width - 50) // 2))

    throughput = _table("Throughput")
    throughput.add_row("SPS", number(value["sps"]), sparkline(series("sps"), spark))
    throughput.add_row("steps", number(value["global_step"]), "")
    throughput.add_row("updates", number(value["updates"]), "")
    throughput.add_row("elapsed", duration(value["elapsed"]), "")

    def latest(name):
        """This update's value, or, when no episode ended in it (long episodes
        near the end of training), the last one that did, marked with '*'."""
        if value[name] == value[name]:
            return number(value[name])
        earlier = [v for v in series(name) if v == v]
        return f"{number(earlier[-1])}*" if earlier else "-"

    episodes = _table("Episodes")
    episodes.add_row("finished", number(value["episodes"]), "")
    episodes.add_row("return", latest("episode_return"), sparkline(series("episode_return"), spark))
    episodes.add_row("length", latest("episode_length"), sparkline(series("episode_length"), spark))

    losses = _table("Losses")
    for name in LOSS_NAMES:
        losses.add_row(name.replace("_", " "), number(value[name]), "")

    split = _table("Time split")
    parts = {"env": value["time_env"], "forward": value["time_forward"], "learn": value["time_learn"]}
    total = sum(v for v in parts.values() if v == v)
    for name, seconds in parts.items():
        if seconds == seconds and total > 0:
            share = seconds / total
            split.add_row(name, f"{share:6.1%}", "█" * int(round(share * 20)))
        else:
            split.add_row(name, "-", "")
    # train.overlap: env and forward ran in the actor process, partly beside learning.
    hidden = value.get("time_overlap", math.nan)
    rollout = parts["env"] + parts["forward"]
    if hidden == hidden and rollout > 0:
        share = min(hidden / rollout, 1.0)
        split.add_row("overlapped", f"{share:6.1%}", "of env+forward ran beside learn")

    env_stats = _table("Env stats")
    # Return and length are already under Episodes; show them here only if
    # the trainer sent a value for them that the Episodes panel lacks.
    shown = {name: stat for name, stat in record.env_stats.items()
             if not (name in ("episode_return", "episode_length") and stat != stat)}
    for name, stat in shown.items():
        env_stats.add_row(name, number(stat), "")
    if not shown:
        env_stats.add_row("(none)", "", "")

    grid = Table.grid(padding=(0, 4))
    grid.add_row(throughput, episodes)
    grid.add_row(Text(""), Text(""))
    grid.add_row(losses, split)
    grid.add_row(Text(""), Text(""))
    grid.add_row(env_stats, resources_table(value, series, spark))
    return Panel(Group(facts, Text(""), grid), title=title, title_align="left")


def render_text(snapshot: Snapshot, width: int = 100) -> str:
    """One frame as plain text (no colour codes): for `--once`, tests, the README."""
    console = Console(width=width, color_system=None, force_terminal=False, legacy_windows=False)
    with console.capture() as capture:
        console.print(render(snapshot, width))
    return capture.get()
