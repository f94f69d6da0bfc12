"""Resource figures: peak memory (trainer, child processes, ranks), CPU, GPU through
NVML (a stand-in here: no GPU on this machine), time to first result; in the training
records, the dashboard and `peregrine profile`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from peregrine.monitor.dashboard import Snapshot, render_text
from peregrine.monitor.metrics import RESOURCE_NAMES, MetricsReader, MetricsWriter
from peregrine.train import resources
from peregrine.train.resources import ResourceProbe, merge_ranks

SRC = str(Path(__file__).resolve().parents[1] / "src")
linux_proc = pytest.mark.skipif(not os.path.exists("/proc/self/status"),
                                reason="per-process figures are read from Linux /proc")


@linux_proc
def test_probe_reports_positive_figures_and_a_fixed_time_to_first_result():
    probe = ResourceProbe()
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:   # busy: CPU must show
        pass
    first = probe.sample()
    assert first["peak_rss_mb"] > 10 and first["peak_rss_total_mb"] >= first["peak_rss_mb"]
    assert first["cpu_percent"] > 0
    assert 0 < first["time_to_first_result"] < time.time() - resources.process_start_time() + 1
    # The process start is what the kernel says, not when this module was imported.
    assert resources.process_start_time() < time.time() - first["time_to_first_result"] + 0.1
    time.sleep(0.05)
    second = probe.sample()
    assert second["time_to_first_result"] == first["time_to_first_result"]
    assert "gpu_util_percent" not in second                # no CUDA device given


@linux_proc
def test_child_processes_are_found_with_their_own_peak_memory():
    """A child that touched ~64 MiB shows as its own entry; the total adds it."""
    code = "b = bytearray(64 << 20); print('ready', flush=True); import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        probe = ResourceProbe()
        figures = probe.sample()
        mine = {name: peak for name, peak in figures["processes"].items()
                if name.endswith(f" {child.pid}")}
        assert len(mine) == 1 and list(mine.values())[0] > 60
        assert figures["peak_rss_total_mb"] == pytest.approx(
            figures["peak_rss_mb"] + sum(figures["processes"].values()))
    finally:
        child.kill()
        child.wait()


def test_merge_ranks_keeps_every_rank_and_totals_their_trees():
    merged = merge_ranks({"peak_rss_mb": 300.0, "peak_rss_total_mb": 310.0, "cpu_percent": 90.0},
                         [(300.0, 310.0), (280.0, 295.0)])
    assert merged["ranks_peak_rss_mb"] == [300.0, 280.0]
    assert merged["peak_rss_total_mb"] == 605.0 and merged["cpu_percent"] == 90.0


# ---- GPU: a stand-in NVML ---------------------------------------------------------------
class NVMLError(Exception):
    pass


def fake_nvml(utilization=37, used_bytes=3 << 30, fail_init=False, fail_sample=False):
    """A module with the five pynvml calls the probe makes."""
    calls = []

    def init():
        calls.append("init")
        if fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def by_index(index):
        calls.append(("index", index))
        return f"handle{index}"

    def by_uuid(uuid):
        raise NVMLError("not found")   # the probe then falls back to the index

    def rates(handle):
        if fail_sample:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(gpu=utilization, memory=12)

    def memory(handle):
        return types.SimpleNamespace(used=used_bytes, total=80 << 30, free=(80 << 30) - used_bytes)

    module = types.SimpleNamespace(nvmlInit=init, nvmlDeviceGetHandleByIndex=by_index,
                                   nvmlDeviceGetHandleByUUID=by_uuid,
                                   nvmlDeviceGetUtilizationRates=rates,
                                   nvmlDeviceGetMemoryInfo=memory, NVMLError=NVMLError)
    return module, calls


def test_gpu_figures_come_from_nvml_for_a_cuda_device(monkeypatch):
    torch = pytest.importorskip("torch")
    module, calls = fake_nvml(utilization=37, used_bytes=3 << 30)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    figures = ResourceProbe(torch.device("cuda", 1)).sample()
    assert figures["gpu_util_percent"] == 37.0 and figures["gpu_memory_mb"] == 3072.0
    assert calls == ["init", ("index", 1)]
    ResourceProbe("cuda:2")
    ResourceProbe("cuda")
    assert calls[2:] == ["init", ("index", 2), "init", ("index", 0)]
    assert "gpu_util_percent" not in ResourceProbe(torch.device("cpu")).sample()


@pytest.mark.parametrize("case", ["not installed", "init fails", "sample fails"])
def test_no_nvml_means_no_gpu_figures_and_never_an_error(monkeypatch, case):
    if case == "not installed":
        monkeypatch.setitem(sys.modules, "pynvml", None)     # import pynvml -> ImportError
    else:
        module, _ = fake_nvml(fail_init=case == "init fails", fail_sample=case == "sample fails")
        monkeypatch.setitem(sys.modules, "pynvml", module)
    probe = ResourceProbe("cuda")
    for _ in range(2):
        figures = probe.sample()
        assert "gpu_util_percent" not in figures and "gpu_memory_mb" not in figures
    assert probe.gpu.error and ("not installed" in probe.gpu.error or "NVML" in probe.gpu.error)
    assert figures["peak_rss_mb"] is None or figures["peak_rss_mb"] > 0


def test_the_dashboard_shows_the_recorded_figures(tmp_path):
    writer = MetricsWriter(tmp_path / "run", [])
    figures = {"peak_rss_mb": 1536.0, "peak_rss_total_mb": 2048.0, "cpu_percent": 187.0,
               "gpu_util_percent": 93.0, "gpu_memory_mb": 5120.0, "time_to_first_result": 4.25}
    writer.update(global_step=10, updates=1, sps=5.0, resources=figures)
    with MetricsReader(tmp_path / "run") as reader:
        record = reader.read()
        assert {name: record[name] for name in RESOURCE_NAMES} == figures
        text = render_text(Snapshot.take(reader), width=120)
    writer.close()
    for shown in ("1.50 GiB", "2.00 GiB", "187%", "93%", "5.00 GiB", "4.2 s"):
        assert shown in text, (shown, text)


# ---- end to end: `peregrine train`, its records, and memory that follows num_envs -------
def train_once(run_dir: Path, num_envs: int) -> list[dict]:
    """Two updates of `num_envs` Prospector games x 16 steps, one epoch."""
    command = [sys.executable, "-m", "peregrine", "train", "prospector", "--run-dir", str(run_dir),
               "--detach", "--train.tensorboard", "false", "--vec.num_envs", str(num_envs),
               "--train.horizon", "16", "--train.minibatch_size", "1024",
               "--train.update_epochs", "1", "--train.total_steps", str(num_envs * 16 * 2),
               "--train.stop_return", "0"]
    result = subprocess.run(command, env=dict(os.environ, PYTHONPATH=SRC), capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "updates" in line]


@linux_proc
def test_training_records_carry_the_figures_and_peak_memory_grows_with_num_envs(tmp_path):
    """Two runs, 64 and 4096 Prospector games x 16 steps (260 floats per observation):
    the big run's rollout observations alone take ~65 MiB more, so its trainer's peak
    RSS must be higher (measured: +107 MiB)."""
    small = train_once(tmp_path / "small", 64)
    large = train_once(tmp_path / "large", 4096)
    for records in (small, large):
        assert len(records) == 2
        for record in records:
            figures = record["resources"]
            assert figures["peak_rss_mb"] > 50 and figures["cpu_percent"] > 0
            assert figures["peak_rss_total_mb"] >= figures["peak_rss_mb"]
            assert 0 < figures["time_to_first_result"] < 200
        assert records[1]["resources"]["time_to_first_result"] == \
            records[0]["resources"]["time_to_first_result"]
    assert large[-1]["resources"]["peak_rss_mb"] > small[-1]["resources"]["peak_rss_mb"] + 40
    with MetricsReader(tmp_path / "large") as reader:     # what the dashboard reads
        latest = reader.read()
        assert latest["peak_rss_mb"] == pytest.approx(large[-1]["resources"]["peak_rss_mb"])
        assert latest["time_to_first_result"] > 0
        text = render_text(Snapshot.take(reader))
    assert "peak RSS" in text and "first result" in text


@linux_proc
def test_multiprocessing_workers_show_in_the_record(tmp_path):
    """The trainer's env workers (Multiprocessing backend) are found as child processes."""
    script = textwrap.dedent("""
        import json
        from peregrine.train import load_config
        from peregrine.train.ppo import Trainer
        if __name__ == "__main__":
            config = load_config("cartpole", overrides=[
                ("vec.backend", "multiprocessing"), ("vec.num_workers", 2), ("vec.num_envs", 8),
                ("train.horizon", 8), ("train.minibatch_size", 64), ("train.update_epochs", 1)])
            trainer = Trainer(config)
            pids = trainer.env.worker_pids
            record = trainer.update()
            trainer.close()
            print(json.dumps({"pids": pids, "resources": record["resources"]}))
    """)
    path = tmp_path / "workers.py"
    path.write_text(script)
    result = subprocess.run([sys.executable, str(path)], env=dict(os.environ, PYTHONPATH=SRC),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    listed = {int(name.rsplit(" ", 1)[1]): peak for name, peak in out["resources"]["processes"].items()}
    assert set(out["pids"]) <= set(listed) and all(listed[pid] > 5 for pid in out["pids"])
    assert out["resources"]["peak_rss_total_mb"] > out["resources"]["peak_rss_mb"] + 10


def test_profile_reports_peak_memory(tmp_path, capsys):
    from peregrine.cli import main as peregrine_main
    for mode in ("env_only", "trainer"):
        extra = ["--set", "train.horizon=8", "--set", "train.minibatch_size=64"] \
            if mode == "trainer" else []
        artifact_path = tmp_path / f"{mode}.json"
        code = peregrine_main(["profile", "cartpole", "--mode", mode, "--seconds", "0.2",
                               "--warmup", "0", "--num-envs", "8", *extra, "--no-artifact",
                               "--json", str(artifact_path)])
        out = capsys.readouterr().out
        assert code == 0
        figures = json.loads(artifact_path.read_text())["resources"]
        assert figures["peak_rss_mb"] > 10 and figures["cpu_percent"] > 0
        assert "time_to_first_result" not in figures      # a profile has no run to start
        assert f"peak memory      : {figures['peak_rss_mb']:,.0f} MiB RSS" in out
