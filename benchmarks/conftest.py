"""Shared set-up of the pytest-benchmark suite (benchmarks/test_bench_*.py).

Sizes: the real sizes by default; ``PEREGRINE_BENCH_TINY=1`` shrinks every
benchmark to a few rows so the whole suite runs as a smoke test in the normal
test run (tests/test_bench_baseline.py, with ``--benchmark-disable``: each
benchmarked call runs once, nothing is timed, nothing fails on speed).

Every result file pytest-benchmark writes (``--benchmark-json``,
``--benchmark-save``) gets, under ``machine_info["peregrine"]``, the source
tree that was measured, the load average before and after the session and
the machine facts of ``peregrine.profile.machine`` (CPU model, cores,
library versions), so a figure is never separated from where it was taken.
"""
from __future__ import annotations

import os

from suite_common import TINY


def _load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def pytest_configure(config):
    config._peregrine_load_before = _load_average()


def pytest_benchmark_update_machine_info(config, machine_info):
    import peregrine
    facts = {}
    try:
        from peregrine.profile.machine import machine_facts
        facts = machine_facts()
    except Exception as error:  # noqa: BLE001 - an older tree may lack it; the rest still counts
        facts = {"machine_facts_error": repr(error)}
    machine_info["peregrine"] = {
        **facts,
        "source": os.path.dirname(os.path.abspath(peregrine.__file__)),
        "tiny": TINY,
        "load_before_1_5_15": getattr(config, "_peregrine_load_before", None),
        "load_after_1_5_15": _load_average(),
    }
