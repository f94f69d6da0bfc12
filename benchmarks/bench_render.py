"""Frames per second of every env's rgb_array renderer (the registry's RENDERERS).

Times `rgb_frame(env, 0)`, what `render()` of the Gymnasium exports calls per
instance, on one instance stepped with random actions between frames (so the
frames show varied states), interleaved across envs and repeated; prints the
median per env. Recording a video at 30 fps needs at least 30 frames/s.

    .venv/bin/python benchmarks/bench_render.py --frames 100 --repeats 3
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import peregrine  # noqa: E402
from peregrine.envs.registry import RENDERERS  # noqa: E402
from peregrine.profile.bench import action_pool  # noqa: E402


def frames_per_second(name: str, frames: int) -> float:
    env = peregrine.make(name, num_envs=1, seed=0)
    module = importlib.import_module(RENDERERS[name])
    pool = action_pool(env, frames)
    module.rgb_frame(env, 0)   # imports and first-use costs out of the timing
    elapsed = 0.0
    for k in range(frames):
        env.step(pool[k])
        start = time.perf_counter()
        module.rgb_frame(env, 0)
        elapsed += time.perf_counter() - start
    env.close()
    return frames / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    samples = {name: [] for name in sorted(RENDERERS)}
    for _ in range(args.repeats):
        for name in samples:
            samples[name].append(frames_per_second(name, args.frames))
    print(f"{args.frames} frames per run, {args.repeats} runs, median shown")
    print(f"{'env':<26}{'frame (px)':>12}{'frames/s':>10}{'ms/frame':>10}")
    for name, values in samples.items():
        env = peregrine.make(name, num_envs=1, seed=0)
        height, width = importlib.import_module(RENDERERS[name]).rgb_frame(env, 0).shape[:2]
        env.close()
        fps = statistics.median(values)
        print(f"{name:<26}{f'{width}x{height}':>12}{fps:>10.0f}{1000 / fps:>10.2f}")


if __name__ == "__main__":
    main()
