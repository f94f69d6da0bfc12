#!/usr/bin/env python3
"""Steps to solve, per seed: train a config until its recent mean return reaches a
threshold (or its total_steps), and print every seed, the median and the worst.

    .venv/bin/python benchmarks/solve_steps.py cartpole --config fast --seeds 1 2 3 4 5

Each seed is one in-process Trainer (no run folder, no checkpoint); `--threshold`
defaults to the config's stop_return. Training SPS is printed beside it (load on the
machine moves it; the steps do not).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env")
    parser.add_argument("--config", help="a shipped variant or a TOML file")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--threshold", type=float)
    args = parser.parse_args(argv)
    from peregrine.train.config import load_config
    from peregrine.train.ppo import Trainer
    solved = []
    for seed in args.seeds:
        config = load_config(args.env, args.config, overrides=[
            ("train.seed", seed), ("train.tensorboard", False), ("train.checkpoint_interval", 0)])
        threshold = args.threshold if args.threshold is not None else config.train.stop_return
        trainer = Trainer(config)
        started, at = time.perf_counter(), None
        try:
            while not trainer.done:
                if (trainer.update()["recent_return"] or 0) >= threshold:
                    at = trainer.global_step
                    break
            seconds = time.perf_counter() - started
            print(f"seed {seed}: " + (f"solved at {at:,} steps" if at else
                                      f"not solved in {trainer.global_step:,} steps")
                  + f", {seconds:.2f} s ({trainer.global_step / seconds:,.0f} SPS)", flush=True)
        finally:
            trainer.close()
        solved.append(at)
    steps = [s for s in solved if s is not None]
    if len(steps) == len(solved):
        print(f"median {statistics.median(steps):,.0f} steps, worst {max(steps):,} "
              f"over seeds {' '.join(map(str, args.seeds))}")
    else:
        print(f"{len(solved) - len(steps)} of {len(solved)} seeds did not solve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
