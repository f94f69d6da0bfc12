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
