"""The suite's one way to wait for another process or thread."""
from __future__ import annotations

import time

from test_vector_helpers import pid_alive


def poll_until(condition, timeout: float, interval: float = 0.05):
    """Calls condition() every `interval` seconds until it returns a true value or
    `timeout` seconds have passed, and returns its last value: the caller asserts
    on it (with its own message) or reads what it found. No wait can hang a test."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_gone(pids, seconds: float) -> list:
    """Waits up to `seconds` for every process in `pids` to end; returns those still
    alive (zombies count as gone)."""
    poll_until(lambda: not any(pid_alive(p) for p in pids), seconds)
    return [p for p in pids if pid_alive(p)]
