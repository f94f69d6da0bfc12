"""The dashboard fits the terminal it is drawn in: at 80 columns (and narrower) no
number is cut, and wide terminals keep panels side by side."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from peregrine.monitor.dashboard import Snapshot, render, render_text
from peregrine.monitor.metrics import MetricsReader, MetricsWriter

LOSSES = {"policy_loss": -0.0123, "value_loss": 31.25, "entropy": 0.5432, "approx_kl": 0.00871,
          "clip_fraction": 0.1375, "learning_rate": 2.5e-4}
# A two-rank run on a GPU machine: every panel full, every resource row present.
RESOURCES = {"peak_rss_mb": 2663.4, "peak_rss_total_mb": 5120.7, "cpu_percent": 187.0,
             "gpu_util_percent": 64.0, "gpu_memory_mb": 1843.0, "time_to_first_result": 6.43}
# Each number of the last record as the dashboard writes it.
NUMBERS = ["1,273,567", "1,277,952", "39", "1,989", "439", "412.5", "-0.0123", "31.25", "0.5432",
           "0.00871", "0.1375", "2.50e-04", "16.7%", "33.3%", "50.0%", "0.0123", "0.0456",
           "2.60 GiB", "5.00 GiB", "187%", "64%", "1.80 GiB", "6.4 s"]
LABELS = ["peak RSS", "all processes", "GPU memory", "first result", "overlapped",
          "learning rate", "pole_angle_abs"]


def snapshot(tmp_path, env_stats=None, run_id="cartpole-20261121-101500-s1"):
    env_stats = env_stats or {"x_position": 0.0123, "pole_angle_abs": 0.0456}
    writer = MetricsWriter(tmp_path / run_id, ["episode_return", "episode_length", *env_stats],
                           world_size=2)
    for i in range(1, 40):
        writer.update(global_step=i * 32768, updates=i, sps=1234567.0 + i * 1000, episodes=i * 51,
                      episode_return=400.0 + i, episode_length=412.5, env_stats=env_stats,
                      losses=LOSSES, time_split={"env": 1.0, "forward": 2.0, "learn": 3.0,
                                                 "overlap": 1.5},
                      resources=RESOURCES)
    with MetricsReader(tmp_path / run_id) as reader:
        return Snapshot.take(reader)


def drawn(snap, width):
    """The frame as a Console of `width` columns prints it (as `peregrine monitor` does)."""
    console = Console(width=width, record=True, color_system=None, force_terminal=False,
                      file=io.StringIO())
    console.print(render(snap, width))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 120, 100, 60, 40])
def test_every_number_appears_whole_and_no_line_is_cut(tmp_path, width):
    out = drawn(snapshot(tmp_path), width)
    assert "…" not in out, out
    assert all(len(line) <= width for line in out.splitlines()), out
    lines = out.splitlines()
    for text in NUMBERS + LABELS:
        # whole, on one line, not wrapped across two
        assert any(text in line for line in lines), (text, out)
    assert "cartpole-20261121-101500-s1" in out and "RUNNING" in out
    # render_text (--once) draws the same frame
    assert render_text(snapshot(tmp_path / "again"), width).count("…") == 0


def test_wide_terminals_keep_panels_side_by_side_and_narrow_ones_stack_them(tmp_path):
    snap = snapshot(tmp_path)

    def same_line(out, left, right):
        return any(left in line and right in line for line in out.splitlines())

    for width in (80, 120):
        out = drawn(snap, width)
        assert same_line(out, "Throughput", "Episodes") and same_line(out, "Env stats", "Resources")
        assert same_line(out, "SPS", "finished")
    wide = drawn(snap, 120)
    # the wide layout has room for full sparklines and every note
    assert "sum of each process's peak" in wide and "of env+forward ran beside learn" in wide
    assert any("▁" in line and len(line.split("▁", 1)[1].split()[0]) >= 20
               for line in wide.splitlines() if line.lstrip("│ ").startswith("SPS"))
    narrow = drawn(snap, 60)
    assert not same_line(narrow, "Throughput", "Episodes")
    assert narrow.index("Throughput") < narrow.index("Episodes") < narrow.index("Resources")


def test_long_env_stat_names_and_run_ids_do_not_cut_numbers(tmp_path):
    stats = {"mean_distance_to_nearest_target_metres": 1234.5678,
             "fraction_of_agents_within_sensor_range": 0.987654}
    snap = snapshot(tmp_path, stats, run_id="drone_swarm-obstacles-global-20261121-101500-s12345")
    for width in (40, 80, 120):
        out = drawn(snap, width)
        assert "…" not in out, out
        lines = out.splitlines()
        for text in ("1,234.6", "0.9877", "1,273,567", "2.60 GiB"):
            assert any(text in line for line in lines), (width, text, out)
        assert "s12345" in out
