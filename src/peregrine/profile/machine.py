"""Facts that make a throughput figure comparable: commit, date, machine, versions."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo; platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def machine_facts() -> dict:
    from ..vector.common import available_cores   # affinity and cgroup quota
    usable = available_cores()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    memory = None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "load_average_1_5_15": load,   # high values mean the machine was shared
        "memory_gib": None if memory is None else round(memory, 1),
        "architecture": platform.machine(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "gymnasium": _version("gymnasium"),
        "peregrine": _version("peregrine-rl"),
        "executable": sys.executable,
    }


def commit_info(directory: Path = PACKAGE_DIR) -> dict:
    """{"hash", "dirty"} of the git checkout holding this code (None outside one)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"hash": None, "dirty": None}
    return {"hash": commit, "dirty": dirty}
