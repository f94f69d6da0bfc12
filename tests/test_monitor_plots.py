"""The end-of-run learning curve PNG."""
from __future__ import annotations

import json

import pytest

from peregrine.monitor.plots import plot_learning_curve, read_jsonl


def write_jsonl(path, lines):
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines))


def test_png_is_written_from_metrics_jsonl(tmp_path):
    records = [{"global_step": 512 * i, "episode_return": 10.0 + i, "episode_length": 10.0 + i,
                "sps": 5000.0} for i in range(1, 40)]
    records[3]["episode_return"] = None               # an update with no finished episode
    write_jsonl(tmp_path / "metrics.jsonl", [*records, {"status": "finished"}, '{"global_step": 9'])
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 39   # status line and torn tail skipped
    path = plot_learning_curve(tmp_path)
    assert path == tmp_path / "learning_curve.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    from PIL import Image
    with Image.open(path) as image:
        width, height = image.size
    assert width == 700 and height > 600                # three panels: return, length, SPS


def test_run_without_episodes_still_gets_a_figure_and_missing_file_is_clear(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [{"global_step": 100, "episode_return": None}])
    assert plot_learning_curve(tmp_path, output=tmp_path / "x.png").stat().st_size > 0
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        plot_learning_curve(tmp_path / "missing")


def test_episode_bins_weight_each_update_by_its_episodes():
    records = [
        {"global_step": 100, "episodes_this_update": 0, "episode_length": None},
        {"global_step": 400, "episodes_this_update": 1, "episode_length": 10.0,
         "env_stats": {"delivered": 2.0}},
        {"global_step": 900, "episodes_this_update": 3, "episode_length": 30.0,
         "env_stats": {"delivered": 6.0}},
        {"global_step": 1500, "episodes_this_update": 2, "episode_length": 5.0,
         "env_stats": {"delivered": 1.0}},
        {"global_step": 2100, "episodes_this_update": 1, "episode_length": float("nan")},
    ]
    from peregrine.monitor.plots import episode_bins
    # bin 0 (steps 0-999): (10 * 1 + 30 * 3) / 4; bin 1: the one update; NaN skipped
    assert episode_bins(records, "episode_length", 1000) == [(900, 25.0, 4), (1500, 5.0, 2)]
    assert episode_bins(records, "delivered", 1000) == [(900, 5.0, 4), (1500, 1.0, 2)]
    assert episode_bins(records, "delivered", 1000, min_episodes=3) == [(900, 5.0, 4)]


def test_the_swarm_curves_script_draws_every_group_and_refuses_bad_specs(tmp_path):
    """benchmarks/plot_swarm_curves.py: a figure from run directories' metrics.jsonl
    (fake runs here), the scripted line measured; a group naming no panel, or a
    glob matching nothing, is refused."""
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import plot_swarm_curves
    finally:
        sys.path.pop(0)
    for seed in (1, 2):
        run = tmp_path / f"run_s{seed}"
        run.mkdir()
        with open(run / "metrics.jsonl", "w") as handle:
            for update in range(1, 6):
                handle.write(json.dumps({"global_step": update * 600_000,
                                         "episodes_this_update": 20,
                                         "episode_length": 1000.0 / update / seed,
                                         "env_stats": {"delivered": update / seed}}) + "\n")
    output = tmp_path / "curves.png"
    assert plot_swarm_curves.main([str(output), "--panel", "wilderness;wilderness;71",
                                   "--group", f"wilderness;fake;{tmp_path}/run_s*"]) == 0
    assert output.stat().st_size > 10_000
    two = tmp_path / "two.png"          # a second panel of an episode statistic
    assert plot_swarm_curves.main([str(two), "--panel", "wilderness;wilderness;71",
                                   "--panel", "default;default;9.8;delivered",
                                   "--group", f"wilderness;fake;{tmp_path}/run_s*",
                                   "--group", f"default;fake;{tmp_path}/run_s*"]) == 0
    assert two.stat().st_size > output.stat().st_size
    with pytest.raises(SystemExit):
        plot_swarm_curves.main([str(output), "--panel", "wilderness;wilderness;71",
                                "--group", f"other;fake;{tmp_path}/run_s*"])
    with pytest.raises(SystemExit):
        plot_swarm_curves.main([str(output), "--panel", "wilderness;wilderness;71",
                                "--group", f"wilderness;fake;{tmp_path}/nothing*"])
