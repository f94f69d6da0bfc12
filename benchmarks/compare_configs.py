#!/usr/bin/env python3
"""Judge configs on fresh seeds: train each on every seed at one budget, evaluate each
trained policy, and print every seed, the median and the worst.

    .venv/bin/python benchmarks/compare_configs.py cartpole shipped runs/sweeps/x/best.toml \\
        --seeds 1 2 3 4 5 --total-steps 40000 --episodes 64 --eval-seed 0

A config is `shipped` (the env's shipped config), a shipped variant's name (`fast`) or a
TOML file (a sweep's best.toml). Every run trains all its steps (`train.stop_return` 0)
so every config gets the same budget, one thread each; the score is the evaluation's
mean of `--metric` (default episode_return) over `--episodes` episodes from
`--eval-seed`, the trained world. Seeds a sweep tuned on must not be the seeds given
here. `--json` writes every row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path


def judge(env: str, config_name: str, seed: int, total_steps: int, episodes: int,
          eval_seed: int, metric: str, folder: Path) -> dict:
    from peregrine.evaluate import evaluate
    from peregrine.train.config import load_config
    from peregrine.train.run import train
    variant = None if config_name == "shipped" else config_name
    config = load_config(env, variant, overrides=[
        ("train.seed", seed), ("train.total_steps", total_steps), ("train.stop_return", 0.0),
        ("train.checkpoint_interval", 0), ("train.tensorboard", False),
        ("train.torch_threads", 1)])
    run_dir = folder / f"{Path(config_name).stem}-seed{seed}"
    summary = train(config, run_dir)
    found = evaluate(env, str(run_dir), episodes=episodes, seed=eval_seed)
    return {"config": config_name, "seed": seed, "steps": summary["global_step"],
            "train_seconds": summary["elapsed"], metric: found["mean"][metric]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env")
    parser.add_argument("configs", nargs="+", help="shipped, a variant name or a TOML file")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--total-steps", type=int, required=True)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--metric", default="episode_return")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.configs:
            for seed in args.seeds:
                row = judge(args.env, name, seed, args.total_steps, args.episodes,
                            args.eval_seed, args.metric, Path(folder))
                rows.append(row)
                print(f"{name}  seed {seed}: {args.metric} {row[args.metric]:.2f} "
                      f"({row['steps']:,} steps, {row['train_seconds']:.1f} s)", flush=True)
    for name in args.configs:
        scores = [row[args.metric] for row in rows if row["config"] == name]
        print(f"{name}: median {statistics.median(scores):.2f}, worst {min(scores):.2f} "
              f"over seeds {' '.join(map(str, args.seeds))}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
