"""benchmarks/bench_vmas.py: VMAS beside Peregrine's DroneSwarm, run at tiny sizes on the CPU.

Skipped where VMAS is not installed (it is an optional peer, not a dependency).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vmas")
torch = pytest.importorskip("torch")

import peregrine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_vmas  # noqa: E402


def test_cli_rows_for_both_simulators(tmp_path):
    out = tmp_path / "rows.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_vmas.py"), "--device", "cpu",
         "--sizes", "4", "--seconds", "0.05", "--json", str(out)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())
    assert [(row["impl"], row["scenario"]) for row in rows] == [
        ("vmas", "discovery"), ("peregrine", "drone_swarm")]
    for row in rows:
        assert row["instances"] == 4
        assert row["agents_per_instance"] == 8
        assert row["device"] == "cpu"
        assert row["agent_steps_per_sec"] > 0, row
    assert "peregrine/vmas" in result.stdout


def test_vmas_is_matched_to_the_drone_swarm():
    env = peregrine.make("drone_swarm", num_envs=2, seed=0)
    try:
        drones = env.agents_per_env
    finally:
        env.close()
    assert bench_vmas.AGENTS_PER_INSTANCE == drones
    kwargs = bench_vmas.scenario_kwargs("discovery")
    assert kwargs == {"n_agents": drones, "n_targets": bench_vmas.VICTIMS_PER_INSTANCE}
    assert bench_vmas.scenario_kwargs("navigation") == {"n_agents": drones}


def test_measure_vmas_counts_every_agent_of_every_instance(monkeypatch):
    # With timed() replaced (3 calls in 0.5 s), the figure is calls * instances * agents / time.
    calls = []

    def fake_timed(step, seconds, sync):
        for _ in range(3):
            step()
        calls.append(seconds)
        return 3, 0.5

    monkeypatch.setattr(bench_vmas, "timed", fake_timed)
    rate = bench_vmas.measure_vmas("discovery", 3, 0.01, torch, "cpu")
    assert calls == [0.01]
    assert rate == pytest.approx(3 * 3 * bench_vmas.AGENTS_PER_INSTANCE / 0.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(SystemExit, match="no CUDA GPU"):
        bench_vmas.main(["--device", "cuda", "--sizes", "4"])
