"""The metrics file and `peregrine monitor`: round trip, torn-read protection,
live / finished / stale runs rendered to text, bad files refused clearly."""
from __future__ import annotations

import math
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from peregrine.cli import main as peregrine_main
from peregrine.monitor import metrics
from peregrine.monitor.metrics import (FIELDS, MetricsFileError, MetricsReader, MetricsWriter,
                                       pid_alive)
from polling import poll_until

SRC = str(Path(__file__).resolve().parents[1] / "src")
LOSSES = {"policy_loss": -0.02, "value_loss": 3.5, "entropy": 0.69, "approx_kl": 0.01,
          "clip_fraction": 0.12, "learning_rate": 2.5e-4}

# A trainer stand-in: publishes records whose every value is derived from one
# counter i, so a reader can tell a consistent record from a torn one.
WRITER_SCRIPT = textwrap.dedent("""
    import sys, time
    from peregrine.monitor.metrics import MetricsWriter
    run_dir, num_stats, mode, ring = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    names = [f"stat{k}" for k in range(num_stats)]
    writer = MetricsWriter(run_dir, names, ring_capacity=ring)
    i = 0
    deadline = time.monotonic() + 20.0   # never outlive the test
    while time.monotonic() < deadline:
        i += 1
        if mode == "raw":                 # all time in the copy: tears are likely unless prevented
            writer._values[1:] = i
            writer._publish()
            # A short gap between writes: a reader that never gets one cannot
            # finish any read (seqlock readers retry while writes overlap), and
            # real trainers publish milliseconds apart anyway.
            gap = time.perf_counter() + 50e-6
            while time.perf_counter() < gap:
                pass
            continue
        writer.update(global_step=i * 64, updates=i, sps=2.0 * i, elapsed=0.5 * i, episodes=3 * i,
                      episode_return=i + 0.25, episode_length=i + 0.5,
                      env_stats={name: i + k for k, name in enumerate(names)},
                      losses={"policy_loss": -i, "value_loss": i, "entropy": i, "approx_kl": i,
                              "clip_fraction": i, "learning_rate": i},
                      time_split={"env": i, "forward": 2 * i, "learn": 3 * i})
        if mode == "die" and i == 5:
            import os
            os._exit(0)                   # a trainer that dies without close()
        if mode == "slow":
            time.sleep(0.01)
        if mode == "finish" and i == 7:
            writer.close("finished")
            break
""")


def start_writer(run_dir, num_stats=2, mode="slow", ring=8):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(run_dir), str(num_stats), mode,
                             str(ring)], env=env)


def wait_for_records(run_dir, count, timeout=15.0):
    def published():
        try:
            with MetricsReader(run_dir) as reader:
                return reader.count >= count
        except MetricsFileError:
            return False

    assert poll_until(published, timeout, 0.02), \
        f"writer did not publish {count} records in {timeout} s"


def check_consistent(record):
    """True if every value of `record` derives from the same counter."""
    i = record["updates"]
    expected = {"global_step": 64 * i, "sps": 2 * i, "elapsed": 0.5 * i, "episodes": 3 * i,
                "episode_return": i + 0.25, "episode_length": i + 0.5, "policy_loss": -i,
                "value_loss": i, "learning_rate": i, "time_env": i, "time_forward": 2 * i,
                "time_learn": 3 * i}
    return all(record[name] == value for name, value in expected.items()) and \
        all(value == i + k for k, value in enumerate(record.env_stats.values()))


def monitor(capsys, *argv):
    code = peregrine_main(["monitor", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- the file ------------------------------------------------------------------
def test_round_trip_values_missing_values_history_and_close(tmp_path):
    writer = MetricsWriter(tmp_path / "run", ["episode_return", "height"], ring_capacity=4)
    with MetricsReader(tmp_path / "run") as reader:
        assert reader.header.run_id == "run" and reader.header.pid == os.getpid()
        assert reader.header.env_stat_names == ("episode_return", "height")
        first = reader.read()
        assert first.status == "starting" and first["global_step"] == 0
        for step in range(1, 7):
            writer.update(global_step=step * 100, updates=step, sps=1000.0 * step, episodes=step,
                          episode_return=float(step), env_stats={"height": 0.5 * step},
                          losses={"entropy": 0.5}, time_split={"env": 1.0})
        latest = reader.read()
        assert latest["global_step"] == 600 and latest["sps"] == 6000.0 and latest["entropy"] == 0.5
        assert latest.env_stats["height"] == 3.0
        assert math.isnan(latest.env_stats["episode_return"])   # not sent -> NaN
        assert math.isnan(latest["value_loss"]) and math.isnan(latest["time_learn"])
        assert math.isnan(latest["episode_length"])
        assert latest.status == "running" and reader.liveness(latest) == "running"
        # the ring keeps the last 4 records, oldest first
        assert [r["updates"] for r in reader.history()] == [3, 4, 5, 6]
        assert [r["updates"] for r in reader.history(2)] == [5, 6]
        writer.close("interrupted")
        assert reader.read().status == "interrupted" and reader.liveness() == "interrupted"
        assert reader.read()["global_step"] == 600
    writer.close("finished")  # idempotent
    with pytest.raises(ValueError, match="closed"):
        writer.update(global_step=1)


def test_update_accepts_none_numpy_scalars_and_junk(tmp_path):
    with MetricsWriter(tmp_path / "run", ["a"]) as writer:
        writer.update(global_step=np.int64(7), sps=np.float32(2.5), episode_return=None,
                      losses={"entropy": "n/a", "value_loss": np.float64(1.5)}, env_stats={"a": None})
        with MetricsReader(tmp_path / "run") as reader:
            record = reader.read()
    assert record["global_step"] == 7 and record["sps"] == 2.5 and record["value_loss"] == 1.5
    assert math.isnan(record["episode_return"]) and math.isnan(record["entropy"])
    assert math.isnan(record.env_stats["a"])


def test_heartbeat_republishes_the_last_values_with_a_new_time(tmp_path):
    with MetricsWriter(tmp_path / "run", []) as writer:
        writer.update(global_step=42, sps=7.0)
        with MetricsReader(tmp_path / "run") as reader:
            before = reader.read()
            time.sleep(0.01)
            writer.heartbeat()
            after = reader.read()
    assert after["heartbeat"] > before["heartbeat"] and after["index"] == before["index"] + 1
    assert after["global_step"] == 42 and after["sps"] == 7.0 and after.status == "running"


def test_writer_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="ring_capacity"):
        MetricsWriter(tmp_path / "a", [], ring_capacity=0)
    with pytest.raises(ValueError, match="duplicates"):
        MetricsWriter(tmp_path / "b", ["x", "x"])
    with MetricsWriter(tmp_path / "c", []) as writer:
        with pytest.raises(ValueError, match="status"):
            writer.update(status="sleeping")
        with pytest.raises(ValueError, match="close status"):
            writer.close("running")


def test_context_manager_marks_crash(tmp_path):
    with pytest.raises(RuntimeError):
        with MetricsWriter(tmp_path / "run", []) as writer:
            writer.update(global_step=5)
            raise RuntimeError("trainer bug")
    with MetricsReader(tmp_path / "run") as reader:
        assert reader.read().status == "crashed" and reader.read()["global_step"] == 5


def test_reader_never_returns_a_record_mid_write(tmp_path):
    """The seqlock itself: an odd sequence means 'being written'; a reader must
    not return that slot's values, and a slot overwritten by a later lap is not
    taken for the record the count points at."""
    writer = MetricsWriter(tmp_path / "run", [], ring_capacity=2)
    writer.update(global_step=10, updates=1)
    with MetricsReader(tmp_path / "run", timeout=0.2) as reader:
        slot = (reader.count - 1) % 2
        offset = writer.header_size + slot * writer.record_size
        path = tmp_path / "run" / "metrics.bin"

        def poke(offset, data):             # a store into the file, as the writer makes
            with open(path, "r+b") as handle:
                os.pwrite(handle.fileno(), data, offset)

        sequence = int(writer._sequences[slot])
        poke(offset, struct.pack("<Q", sequence + 1))   # pretend the writer stopped mid-record
        with pytest.raises(MetricsFileError, match="stuck mid-record"):
            reader.read()
        poke(offset, struct.pack("<Q", sequence))       # record complete again
        assert reader.read()["global_step"] == 10
        # a slot whose record index is not the one the count names (lapped) is skipped
        poke(offset + 8, struct.pack("<d", 999.0))
        assert reader._read_record(reader.count - 1) is None
        with pytest.raises(MetricsFileError, match="not in its slot"):   # and no hang
            reader.read()
    writer.close()


def test_no_torn_reads_while_another_process_hammers_updates(tmp_path):
    # One slot rewritten back to back with 20000 values that all equal one
    # counter: without the sequence check, a few percent of reads here see a
    # record that is half one update and half the next.
    process = start_writer(tmp_path / "run", num_stats=20000, mode="raw", ring=1)
    try:
        wait_for_records(tmp_path / "run", 10)
        with MetricsReader(tmp_path / "run") as reader:
            seen = set()
            published_before = reader.count
            # At least 1.5 s of reading, and on until the reader has raced more
            # than 20 of the writer's records (a loaded machine gives the
            # writer fewer turns; the bound only keeps a hang finite).
            started = time.monotonic()
            while time.monotonic() < started + 1.5 or (
                    (len(seen) <= 20 or reader.count - published_before <= 20)
                    and time.monotonic() < started + 30):
                record = reader.read()
                values = np.array([*list(record.values.values())[1:], *record.env_stats.values()])
                assert (values == values[0]).all(), f"torn record near update {values[0]}"
                seen.add(values[0])
            published_during = reader.count - published_before
        # The reads really raced the writer: it kept publishing throughout, and
        # the reader completed many different records between its writes.
        assert published_during > 20, "the writer should have made progress while we read"
        assert len(seen) > 20
    finally:
        process.kill()
        process.wait()


# ---- the dashboard ---------------------------------------------------------------
def test_once_renders_a_live_run_then_the_finished_run(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "live-run"
    process = start_writer(run_dir, mode="slow")
    try:
        wait_for_records(run_dir, 5)
        with MetricsReader(run_dir) as reader:   # records written through update() are whole
            assert all(check_consistent(r) for r in reader.history() if r["updates"] > 0)
        code, out, _ = monitor(capsys, "live-run", "--runs-dir", tmp_path / "runs", "--once")
        assert code == 0
        assert "run live-run" in out and "RUNNING" in out
        for label in ("SPS", "steps", "return", "policy loss", "entropy", "env", "forward", "learn", "stat1"):
            assert label in out
        assert any(ch in out for ch in "▁▂▃▄▅▆▇█")      # sparkline from the ring
    finally:
        process.kill()
        process.wait()

    writer = MetricsWriter(tmp_path / "runs" / "done", ["score"])
    writer.update(global_step=123456, updates=7, sps=98765.0, episodes=42, episode_return=187.5,
                  episode_length=187.5, env_stats={"score": 3.25}, losses=LOSSES,
                  time_split={"env": 1.0, "forward": 1.0, "learn": 2.0})
    writer.close("finished")
    code, out, _ = monitor(capsys, tmp_path / "runs" / "done", "--once")
    assert code == 0 and "FINISHED" in out
    for text in ("123,456", "98,765", "187", "3.25", "25.0%", "50.0%", "2.50e-04"):
        assert text in out, text
    # --latest picks the run started last; --list shows both
    code, out, _ = monitor(capsys, "--latest", "--runs-dir", tmp_path / "runs", "--once")
    assert code == 0 and "run done" in out
    code, out, _ = monitor(capsys, "--list", "--runs-dir", tmp_path / "runs")
    assert code == 0 and "live-run" in out and "done" in out and "finished" in out


def test_an_update_without_finished_episodes_shows_the_last_return(tmp_path, capsys):
    writer = MetricsWriter(tmp_path / "run", [])
    writer.update(global_step=1000, updates=1, episodes=3, episode_return=431.5,
                  episode_length=431.5, losses=LOSSES)
    writer.update(global_step=2000, updates=2, episodes=3, losses=LOSSES)  # none ended
    writer.close("finished")
    code, out, _ = monitor(capsys, tmp_path / "run", "--once")
    assert code == 0
    return_row = next(line for line in out.splitlines() if " return " in line)
    assert "431.5*" in return_row


def test_a_data_parallel_run_shows_its_world_size(tmp_path, capsys):
    """The world size lives in the header (records keep their layout); files that do
    not name one read as one rank, and the dashboard then says nothing about ranks."""
    for name, ranks in (("dist", 4), ("plain", None)):
        writer = MetricsWriter(tmp_path / name, [], **({} if ranks is None else
                                                      {"world_size": ranks}))
        writer.update(global_step=1000, updates=1, sps=5000.0, losses=LOSSES)
        writer.close("finished")
    with MetricsReader(tmp_path / "dist") as reader:
        assert reader.header.world_size == 4
    with MetricsReader(tmp_path / "plain") as reader:
        assert reader.header.world_size == 1
    _, out, _ = monitor(capsys, tmp_path / "dist", "--once")
    assert "4 ranks (global SPS)" in out
    _, out, _ = monitor(capsys, tmp_path / "plain", "--once")
    assert "ranks" not in out


def test_the_dashboard_shows_progress_toward_the_budget_and_the_time_left(tmp_path, capsys):
    """It showed the steps done only; a file without a budget (older ones) still does."""
    writers = {}
    for name, total in (("budget", 100_000), ("none", None)):       # running: not closed
        writers[name] = MetricsWriter(tmp_path / name, [], total_steps=total)
        writers[name].update(global_step=20_000, updates=10, sps=5000.0, losses=LOSSES)
    with MetricsReader(tmp_path / "budget") as reader:
        assert reader.header.total_steps == 100_000
    _, out, _ = monitor(capsys, tmp_path / "budget", "--once")
    steps = next(line for line in out.splitlines() if " steps " in line)
    assert "20,000 / 100,000" in steps and "█" in steps             # a fifth of the bar
    assert any(" left " in line and "0:00:16" in line for line in out.splitlines()), out
    _, out, _ = monitor(capsys, tmp_path / "none", "--once")
    assert " / " not in next(line for line in out.splitlines() if " steps " in line)
    assert " left " not in out
    writers["budget"].close("finished")         # ended: no time left to show
    _, out, _ = monitor(capsys, tmp_path / "budget", "--once")
    assert " left " not in out and "20,000 / 100,000" in out
    writers["none"].close("finished")


def test_dead_trainer_shows_as_stale(tmp_path, capsys):
    process = start_writer(tmp_path / "run", mode="die")
    process.wait(timeout=30)
    assert not pid_alive(process.pid)
    with MetricsReader(tmp_path / "run") as reader:
        assert reader.read().status == "running"        # it never said goodbye
        assert reader.liveness() == "stale"
    code, out, _ = monitor(capsys, tmp_path / "run", "--once")
    assert code == 0 and "STALE" in out and "trainer process is gone" in out


def test_silent_when_the_process_lives_but_heartbeat_is_old(tmp_path):
    with MetricsWriter(tmp_path / "run", []) as writer:
        writer.update(global_step=1)
        with MetricsReader(tmp_path / "run") as reader:
            record = reader.read()
            record.values["heartbeat"] -= 60
            assert reader.liveness(record, stale_after=10) == "silent"
            assert reader.liveness(reader.read(), stale_after=10) == "running"


def _valid_file(tmp_path) -> bytes:
    with MetricsWriter(tmp_path / "good", ["x"]) as writer:
        writer.update(global_step=3)
    return (tmp_path / "good" / "metrics.bin").read_bytes()


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"GIF89a" + b"\0" * 200, "not a Peregrine metrics file"),
    (lambda data: b"", "truncated"),
    (lambda data: data[: len(data) // 2], "truncated"),
    (lambda data: data[:8] + struct.pack("<I", 99) + data[12:], "version 99"),
    (lambda data: data[:128] + b"{not json" + data[137:], "corrupt"),
    (lambda data: data[:24] + struct.pack("<I", 0) + data[28:], "corrupt"),
])
def test_corrupt_or_foreign_files_give_a_clear_message(tmp_path, capsys, damage, message):
    data = _valid_file(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.bin").write_bytes(damage(data))
    with pytest.raises(MetricsFileError, match=message):
        MetricsReader(bad)
    code, _, err = monitor(capsys, bad, "--once")
    assert code == 1 and message in err and "Traceback" not in err


def test_missing_run_and_bad_arguments(tmp_path, capsys):
    code, _, err = monitor(capsys, "nope", "--runs-dir", tmp_path, "--once")
    assert code == 1 and "no run 'nope'" in err
    code, _, err = monitor(capsys, "--latest", "--runs-dir", tmp_path, "--once")
    assert code == 1 and "no runs" in err
    code, _, err = monitor(capsys, "--once", "--runs-dir", tmp_path)
    assert code == 2 and "exactly one of" in err


def test_live_mode_exits_when_the_run_finishes_and_ctrl_c_only_detaches(tmp_path):
    """The live view (a real subprocess) ends by itself once the run is final;
    SIGINT to the monitor detaches with exit 0 and the writer keeps going."""
    run_dir = tmp_path / "run"
    process = start_writer(run_dir, mode="slow")
    env = dict(os.environ, PYTHONPATH=SRC)
    try:
        wait_for_records(run_dir, 3)
        viewer = subprocess.Popen([sys.executable, "-m", "peregrine.cli", "monitor", str(run_dir),
                                   "--interval", "0.1"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        assert "attached to" in viewer.stderr.readline()   # the view is up
        time.sleep(0.5)
        viewer.send_signal(signal.SIGINT)
        out, err = viewer.communicate(timeout=15)
        assert viewer.returncode == 0 and "detached" in out + err
        assert "RUNNING" in out                             # the last frame it drew
        with MetricsReader(run_dir) as reader:
            before = reader.count
            time.sleep(0.3)
            assert reader.count > before and process.poll() is None   # training unaffected
    finally:
        process.kill()
        process.wait()

    finishing = start_writer(tmp_path / "fin", mode="finish")
    finishing.wait(timeout=30)
    viewer = subprocess.run([sys.executable, "-m", "peregrine.cli", "monitor", str(tmp_path / "fin"),
                             "--interval", "0.1"], env=env, capture_output=True, text=True, timeout=30)
    assert viewer.returncode == 0 and "FINISHED" in viewer.stdout


def test_record_layout_is_fixed():
    """Readers in other languages rely on these offsets (see the module docstring)."""
    assert metrics._FIXED.size == 64 and FIELDS[0] == "index" and FIELDS[18] == "status"
    assert len(FIELDS) == len(set(FIELDS)) == 26 and FIELDS[19] == "time_overlap"  # appended
    assert FIELDS[20:] == metrics.RESOURCE_NAMES                                   # appended
    assert np.dtype(np.float64).itemsize == 8


def test_import_peregrine_does_not_load_the_monitor_or_profiler():
    code = ("import sys, peregrine; "
            "print(sorted(m for m in sys.modules if m.startswith(('peregrine.monitor', 'peregrine.profile', 'rich'))))")
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_overlapped_time_is_shown_as_such_and_older_files_still_read(tmp_path, capsys):
    """train.overlap's records carry the rollout seconds that ran beside learning: the
    dashboard shows them as a share of env + forward. A file written before the field
    existed (the fields from it on missing from its names block) still reads, without
    that row and with '-' for the resource figures."""
    writer = MetricsWriter(tmp_path / "runs" / "overlap", [])
    writer.update(global_step=1000, updates=1, sps=10.0, losses=LOSSES,
                  time_split={"env": 1.0, "forward": 3.0, "learn": 6.0, "overlap": 3.0})
    writer.close("finished")
    code, out, _ = monitor(capsys, tmp_path / "runs" / "overlap", "--once")
    assert code == 0 and "overlapped" in out and "75.0%" in out

    old_fields = FIELDS[:FIELDS.index("time_overlap")]
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(metrics, "FIELDS", old_fields)
    monkeypatch.setattr(metrics, "_INDEX", {n: i for i, n in enumerate(old_fields)})
    try:
        old = MetricsWriter(tmp_path / "runs" / "old", [])
        old._values = old._values[:len(old_fields)]   # the old writer's record, fewer fields
        old._values[metrics._INDEX["status"]] = metrics.STATUS_CODES["finished"]
        old._publish()
    finally:
        monkeypatch.undo()
    with MetricsReader(tmp_path / "runs" / "old") as reader:
        assert "time_overlap" not in reader.header.fields
        assert reader.read()["status"] == metrics.STATUS_CODES["finished"]
    code, out, _ = monitor(capsys, tmp_path / "runs" / "old", "--once")
    assert code == 0 and "overlapped" not in out
    resources = out[out.index("Resources"):]
    assert "peak RSS" in resources and "MiB" not in resources and "first result" in resources
