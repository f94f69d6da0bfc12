"""Pieces shared by every backend: seeds, settings checks, statistics, buffer slices.

A backend runs *units*: objects with the NativeEnv interface (num_envs,
agents_per_env, spaces, reset/step/episode_stats/close) that write into a
given slice of rows of the backend's buffers. A unit is either a native batch
(one C call steps many instances) or one emulated Gymnasium/PettingZoo env.
"""
from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import overload

import numpy as np

from ..envs.native.batch import BUFFER_NAMES, Buffers, EpisodeStats, resolve_seed

__all__ = ["BUFFER_NAMES", "Buffers", "EpisodeStats", "resolve_seed", "unit_seed",
           "check_count", "merge_stats", "merge_sums", "stats_to_sums", "slice_buffers",
           "buffers_layout", "available_cores", "cgroup_cpu_limit", "CoresWarning",
           "warn_if_oversubscribed", "auto_workers"]

_SEED_STRIDE = 0x9E3779B97F4A7C15  # odd: distinct units get distinct seeds mod 2**64


@overload
def unit_seed(seed: int, unit: int) -> int: ...
@overload
def unit_seed(seed: None, unit: int) -> None: ...
def unit_seed(seed: int | None, unit: int) -> int | None:
    """The seed of unit `unit` of a vector env seeded with `seed`.

    Unit 0 gets `seed` itself, so a one-unit vector env reproduces the plain
    env; every backend derives unit seeds the same way, which is what makes
    Serial and Multiprocessing agree bit for bit.
    """
    if seed is None:
        return None
    return (int(seed) + unit * _SEED_STRIDE) % (1 << 63)


def check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


# Where the cgroup files are read (tests point these at fake trees).
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


class CoresWarning(RuntimeWarning):
    """More worker processes or ranks than available_cores(): they take turns on the CPU."""


def _cgroup_dirs() -> list[Path]:
    """The cgroup directories whose CPU quota binds this process: its own cgroup and
    every parent, on the v2 tree (CGROUP_ROOT) and on a v1 cpu controller mount
    (CGROUP_ROOT/cpu or CGROUP_ROOT/cpu,cpuacct). Inside a container the mount is
    the container's own cgroup while /proc/self/cgroup may name the host's path,
    so the mount points themselves are always included; paths that do not exist
    are simply not read."""
    try:
        lines = PROC_SELF_CGROUP.read_text().splitlines()
    except OSError:
        lines = []
    roots = [CGROUP_ROOT, CGROUP_ROOT / "cpu", CGROUP_ROOT / "cpu,cpuacct"]
    dirs = list(roots)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":                                   # v2: "0::/path"
            mounts = [CGROUP_ROOT]
        elif "cpu" in controllers.split(","):                   # v1: "4:cpu,cpuacct:/path"
            mounts = roots[1:]
        else:
            continue
        relative = Path(path.lstrip("/"))
        for mount in mounts:
            dirs += [mount / parent for parent in [relative, *relative.parents]]
    return list(dict.fromkeys(dirs))


def _quota(directory: Path) -> float | None:
    """CPUs' worth of time the cgroup at `directory` may use, or None (no limit, no file)."""
    try:
        fields = (directory / "cpu.max").read_text().split()             # v2: "QUOTA PERIOD"
        if len(fields) == 2 and fields[0] != "max" and int(fields[1]) > 0:
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError):
        pass
    try:                                                                  # v1: quota -1 = none
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_limit() -> float | None:
    """The CPU quota of this process's cgroups in CPUs (quota / period, the tightest
    of its cgroup and their parents), or None without one (or without cgroups)."""
    limits = [limit for limit in map(_quota, _cgroup_dirs()) if limit is not None]
    return min(limits) if limits else None


def available_cores() -> int:
    """The cores this process may keep busy: the CPUs of its affinity mask
    (os.sched_getaffinity, as os.process_cpu_count() gives it; os.cpu_count()
    where the OS has no masks), capped by its cgroup CPU quota rounded up (a
    container allowed 1.5 CPUs of time counts 2), and at least 1.

    The one count behind every "how many cores" question: the Multiprocessing
    backend's worker check, num_workers = "auto", `--nproc N` and `--nproc auto`,
    and the benchmarks' machine records."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):    # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def warn_if_oversubscribed(count: int, what: str, advice: str, stacklevel: int = 2) -> bool:
    """Warns (CoresWarning) when `count` processes of one kind (`what`: "workers",
    "ranks") are more than the available cores, with the same words wherever it is
    asked; `advice` says how to ask for fewer. True if it warned."""
    cores = available_cores()
    if count <= cores:
        return False
    warnings.warn(f"{count} {what} on {cores} available core{'' if cores == 1 else 's'}: they "
                  f"take turns on the CPU, so each runs slower than on a core of its own "
                  f"({what} beyond the core count rarely add throughput). {advice}",
                  CoresWarning, stacklevel=stacklevel + 1)
    return True


def auto_workers(num_envs: int, multiple: int = 1) -> int:
    """Workers for `num_workers = "auto"`: one per available core, as many as divide
    num_envs (every worker runs the same number of envs), a multiple of `multiple`
    (the trainer's vec.split groups; at least `multiple` workers, even on fewer
    cores). `multiple` must divide num_envs."""
    cores = max(multiple, min(available_cores(), num_envs))
    return max(w for w in range(multiple, cores + 1, multiple) if num_envs % w == 0)


def stats_to_sums(stats: EpisodeStats):
    """(count, {name: sum}, {name: sum of squares}) recovered from mean/std."""
    sums = {name: mean * stats.count for name, mean in stats.mean.items()}
    squares = {name: (stats.std[name] ** 2 + mean ** 2) * stats.count
               for name, mean in stats.mean.items()}
    return stats.count, sums, squares


def merge_sums(parts) -> EpisodeStats:
    """EpisodeStats over (count, sums, squares) triples of disjoint episode sets."""
    count, sums, squares = 0, {}, {}
    for part_count, part_sums, part_squares in parts:
        count += part_count
        for name, value in part_sums.items():
            sums[name] = sums.get(name, 0.0) + value
            squares[name] = squares.get(name, 0.0) + part_squares[name]
    names = list(sums)
    return EpisodeStats.from_sums(names, count, [sums[n] for n in names],
                                  [squares[n] for n in names])


def merge_stats(stats_list) -> EpisodeStats:
    """One EpisodeStats over several disjoint ones (count-weighted)."""
    return merge_sums(stats_to_sums(s) for s in stats_list)


def buffers_layout(num_agents: int, single_observation_space, single_action_space):
    """The seven buffers for `num_agents` rows of the given single spaces."""
    obs_space, action_space = single_observation_space, single_action_space
    return Buffers.layout(num_agents, int(obs_space.shape[0]), obs_space.dtype,
                          tuple(action_space.shape), action_space.dtype)


def slice_buffers(buffers: Buffers, start: int, stop: int) -> dict:
    """Rows [start, stop) of every buffer: C-contiguous views, no copy."""
    return {name: getattr(buffers, name)[start:stop] for name in BUFFER_NAMES}
