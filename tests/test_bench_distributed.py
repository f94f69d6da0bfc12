"""benchmarks/bench_distributed.py: which CPUs the ranks are pinned to."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_distributed  # noqa: E402


def test_ranks_take_one_cpu_of_every_physical_core_before_any_sibling():
    """16 CPUs, 8 cores of two hardware threads: numbered sibling-adjacent (0,1 one
    core) or split (0,8 one core), 8 ranks land on 8 different cores either way; a
    machine without SMT keeps its order; CPUs outside the affinity are never taken."""
    adjacent = {cpu: (0, cpu // 2) for cpu in range(16)}
    split = {cpu: (0, cpu % 8) for cpu in range(16)}
    order = bench_distributed.rank_cpus(adjacent, allowed=range(16))
    assert order[:8] == [0, 2, 4, 6, 8, 10, 12, 14] and sorted(order) == list(range(16))
    assert bench_distributed.rank_cpus(split, allowed=range(16)) == list(range(16))
    for topology in (adjacent, split):
        first = bench_distributed.rank_cpus(topology, allowed=range(16))[:8]
        assert len({topology[cpu] for cpu in first}) == 8
    two_packages = {cpu: (cpu // 4, cpu % 4) for cpu in range(8)}   # same core_id, two sockets
    assert bench_distributed.rank_cpus(two_packages, allowed=range(8)) == list(range(8))
    assert bench_distributed.rank_cpus(adjacent, allowed=[3, 5, 2]) == [2, 5, 3]
    assert bench_distributed.rank_cpus({}, allowed=[1, 0]) == [0, 1]     # unknown: own cores


def test_this_machines_order_holds_every_allowed_cpu_once():
    order = bench_distributed.rank_cpus()
    assert sorted(order) == sorted(os.sched_getaffinity(0))
    assert bench_distributed.cpu_list(1) == str(order[0])
