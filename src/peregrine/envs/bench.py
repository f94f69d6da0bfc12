"""`peregrine bench ENV`: env steps/s and agent steps/s of a native batch.

Random actions are generated before the timed region (a pool of batches,
cycled), so the figure is the env's own cost: one C call per step.
"""
from __future__ import annotations

import json
import platform
import time

import numpy as np

from ..registry import make


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


def add_arguments(parser):
    parser.add_argument("env")
    parser.add_argument("--num-envs", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")


def run(args) -> int:
    if args.seconds <= 0:
        raise SystemExit("--seconds must be positive")
    result = measure(args.env, args.num_envs, args.threads, args.seconds, seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['env']}: {result['num_envs']} envs x {result['agents_per_env']} agents, "
              f"{result['num_threads']} thread(s), {result['seconds']:.1f} s")
        print(f"  env steps/s   : {result['env_steps_per_sec']:,.0f}")
        print(f"  agent steps/s : {result['agent_steps_per_sec']:,.0f}")
    return 0
