"""Learning on emulated envs with a Dict observation and a PettingZoo env, five seeds.

    .venv/bin/python benchmarks/learn_any_env.py doorkey --seeds 1 2 3 4 5 --out FILE.jsonl
    .venv/bin/python benchmarks/learn_any_env.py kaz --seeds 1 2 3 4 5 --out FILE.jsonl

doorkey: MiniGrid DoorKey-5x5 through its Dict observation (benchmarks/configs/doorkey.toml);
per seed, the success rate of the trained policy (actions sampled, as in training) over
100 fresh episodes (seeds 10_000 + k): an episode succeeds when it reaches the goal
(terminated with reward > 0).
kaz: PettingZoo's knights_archers_zombies (benchmarks/configs/kaz.toml); per seed, the
mean episode return (over agents) of the first and the last tenth of the updates, and
whether it rose. One JSON line per seed is appended to --out as each finishes.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

CONFIGS = Path(__file__).resolve().parent / "configs"


def train_seed(key: str, seed: int, run_dir: Path) -> dict:
    from peregrine.train.config import load_config
    from peregrine.train.run import train
    config = load_config(None, CONFIGS / f"{key}.toml", [("train.seed", seed)])
    start = time.perf_counter()
    summary = train(config, run_dir, overwrite=True)
    return {"seed": seed, "global_step": summary["global_step"], "sps": summary["sps"],
            "wall_seconds": time.perf_counter() - start}


def curve(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["episode_return"] for r in records if r.get("episode_return") is not None]


def doorkey_success(run_dir: Path, episodes: int = 100) -> float:
    """The checkpoint's actor (actions sampled, as in training) on fresh episodes of the
    env it was trained on."""
    from peregrine.train.checkpoint import env_kwargs, load_actor
    from peregrine.vector.emulation import emulate
    from peregrine.vector.sources import EnvFactory
    factory = EnvFactory.from_keywords(*env_kwargs(run_dir))
    successes, actor = 0, None
    for episode in range(episodes):
        unit = emulate(factory(), seed=10_000 + episode)
        if actor is None:       # feed-forward: no state to reset between episodes
            import torch
            actor = load_actor(run_dir, unit)
            # sampled as in training: an argmax MiniGrid policy can loop forever in front
            # of a wall, which says little about what was learned
            actor.generator = torch.Generator().manual_seed(episodes)
        try:
            while unit.episode_stats(clear=False).count == 0:
                unit.step(np.ascontiguousarray(actor(unit.observations), dtype=unit.actions.dtype))
            successes += unit.episode_stats().mean["episode_return"] > 0
        finally:
            unit.close()
    return successes / episodes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env", choices=["doorkey", "kaz"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--runs", default="runs/learn-any-env")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for seed in args.seeds:
        run_dir = Path(args.runs) / f"{args.env}-s{seed}"
        row = {"env": args.env, **train_seed(args.env, seed, run_dir)}
        returns = curve(run_dir)
        tenth = max(1, len(returns) // 10)
        row["first_tenth_return"] = float(np.mean(returns[:tenth]))
        row["last_tenth_return"] = float(np.mean(returns[-tenth:]))
        if args.env == "doorkey":
            row["success_rate"] = doorkey_success(run_dir)
        else:
            row["improved"] = row["last_tenth_return"] > row["first_tenth_return"]
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
