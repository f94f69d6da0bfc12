"""Sizes and small facts shared by the pytest-benchmark suite's files
(benchmarks/ is on sys.path when pytest collects them)."""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# PEREGRINE_BENCH_TINY=1: a few rows everywhere, for the smoke run in the test suite.
TINY = os.environ.get("PEREGRINE_BENCH_TINY", "") not in ("", "0")


def usable_cores() -> int:
    """Cores this process may keep busy (the "all threads" of a native env step):
    affinity and cgroup quota, the count the library itself uses."""
    from peregrine.vector.common import available_cores
    return available_cores()


def thread_counts() -> list[int]:
    """1 and all usable cores (just [1] on a one-core machine)."""
    return sorted({1, usable_cores()})


def tiny_trainer_overrides() -> list[tuple[str, object]]:
    """Config overrides that shrink a PPO update to a few rows (none at real sizes).
    torch.compile is off in the smoke run: its first compile alone takes 10-30 s."""
    if not TINY:
        return []
    return [("vec.num_envs", 4), ("train.horizon", 8), ("train.minibatch_size", 32),
            ("train.update_epochs", 1), ("train.compile", False)]


def seconds(benchmark, statistic: str = "median") -> float:
    """The benchmark's `statistic` in seconds per call; NaN when timing is off
    (--benchmark-disable: the call ran once, untimed)."""
    stats = getattr(benchmark, "stats", None)
    return float("nan") if stats is None else getattr(stats.stats, statistic)


def cycling(step, inputs):
    """A zero-argument call that steps with the next of `inputs` each time (round robin),
    so a benchmark never times the drawing of random actions."""
    position = {"i": 0}

    def call():
        position["i"] = (position["i"] + 1) % len(inputs)
        step(inputs[position["i"]])

    return call
