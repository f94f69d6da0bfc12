"""Pieces shared by every backend: seeds, settings checks, statistics, buffer slices.

A backend runs *units*: objects with the NativeEnv interface (num_envs,
agents_per_env, spaces, reset/step/episode_stats/close) that write into a
given slice of rows of the backend's buffers. A unit is either a native batch
(one C call steps many instances) or one emulated Gymnasium/PettingZoo env.
"""
from __future__ import annotations

import os

import numpy as np

from ..envs.native.batch import BUFFER_NAMES, Buffers, EpisodeStats, resolve_seed

__all__ = ["BUFFER_NAMES", "Buffers", "EpisodeStats", "resolve_seed", "unit_seed",
           "check_count", "merge_stats", "merge_sums", "stats_to_sums", "slice_buffers",
           "buffers_layout", "available_cores", "auto_workers"]

_SEED_STRIDE = 0x9E3779B97F4A7C15  # odd: distinct units get distinct seeds mod 2**64


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


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_workers(num_envs: int) -> int:
    """Workers for `num_workers = "auto"`: one per available core, as many as divide
    num_envs (every worker runs the same number of envs)."""
    cores = max(1, min(available_cores(), num_envs))
    return max(w for w in range(1, cores + 1) if num_envs % w == 0)


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
