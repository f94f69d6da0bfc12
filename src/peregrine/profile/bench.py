"""Env-only throughput: env steps/s and agent steps/s of a native batch
(`peregrine bench ENV`, the benchmarks and the profiler measure with it).

Random actions are generated before the timed region (a pool of batches,
cycled), so the figure is the env's own cost: one C call per step.
"""
from __future__ import annotations

import platform
import time

import numpy as np

from ..envs.registry import make


def action_pool(env, count: int, seed: int = 0) -> list[np.ndarray]:
    space = env.action_space
    space.seed(seed)
    return [np.ascontiguousarray(space.sample()) for _ in range(count)]


def measure(name: str, num_envs: int, num_threads: int, seconds: float, warmup: float = 0.2,
            seed: int = 0, **config) -> dict:
    """Steps the batch for `seconds` after `warmup` and reports throughput."""
    env = make(name, num_envs=num_envs, seed=seed, num_threads=num_threads, **config)
    try:
        actions = action_pool(env, 16, seed)
        deadline = time.perf_counter() + warmup
        while time.perf_counter() < deadline:
            env.step(actions[0])
        steps = 0
        start = time.perf_counter()
        elapsed = 0.0
        while elapsed < seconds:
            for batch in actions:
                env.step(batch)
            steps += len(actions)
            elapsed = time.perf_counter() - start
        return {
            "env": name,
            "num_envs": num_envs,
            "num_threads": num_threads,
            "agents_per_env": env.agents_per_env,
            "seconds": elapsed,
            "env_steps_per_sec": steps * num_envs / elapsed,
            "agent_steps_per_sec": steps * env.num_agents / elapsed,
            "machine": platform.processor() or platform.machine(),
        }
    finally:
        env.close()

