"""Learning on emulated envs with a Dict observation and a PettingZoo env, five seeds.

    .venv/bin/python benchmarks/learn_any_env.py doorkey --seeds 1 2 3 4 5 --out FILE.jsonl
    .venv/bin/python benchmarks/learn_any_env.py kaz --seeds 1 2 3 4 5 --out FILE.jsonl

doorkey: MiniGrid DoorKey-5x5 through its Dict observation (benchmarks/configs/doorkey.toml);
per seed, the success rate of the trained policy (actions sampled, as in training) over
100 fresh episodes (seeds 10_000 + k): an episode succeeds when it reaches the goal
(terminated with reward > 0).
`--lib sb3` (doorkey only): SB3's PPO with the RL Zoo's values for DoorKey-5x5 (8 envs,
MiniGrid's FlatObsWrapper, VecNormalize, 128 steps, 10 epochs of 64, lr 2.5e-4, no entropy
bonus) at the same 300k-step budget, scored the same way (sampled actions, the same 100
episodes, observations normalised with the frozen training statistics).
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
            # sampled as in training: an argmax MiniGrid policy can loop forever in front
            # of a wall, which says little about what was learned
            actor = load_actor(run_dir, unit, sample_seed=episodes)
        try:
            while unit.episode_stats(clear=False).count == 0:
                unit.step(np.ascontiguousarray(actor(unit.observations), dtype=unit.actions.dtype))
            successes += unit.episode_stats().mean["episode_return"] > 0
        finally:
            unit.close()
    return successes / episodes


DOORKEY_ID = "MiniGrid-DoorKey-5x5-v0"
DOORKEY_STEPS = 300_000       # benchmarks/configs/doorkey.toml's total_steps


def sb3_doorkey(seed: int, run_dir: Path, episodes: int = 100) -> dict:
    """SB3 PPO with the RL Zoo's DoorKey-5x5 values at Peregrine's budget: the training
    curve from its Monitor files, then the success rate as `doorkey_success` counts it."""
    import gymnasium
    import minigrid  # noqa: F401  (registers the MiniGrid ids)
    from minigrid.wrappers import FlatObsWrapper
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    run_dir.mkdir(parents=True, exist_ok=True)
    venv = VecNormalize(make_vec_env(DOORKEY_ID, n_envs=8, seed=seed, monitor_dir=str(run_dir),
                                     wrapper_class=FlatObsWrapper))
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=64, gae_lambda=0.95, gamma=0.99,
                n_epochs=10, ent_coef=0.0, learning_rate=2.5e-4, clip_range=0.2, seed=seed,
                device="cpu", verbose=0)
    start = time.perf_counter()
    model.learn(DOORKEY_STEPS)
    wall = time.perf_counter() - start
    episodes_seen = []          # (end time, return) of every training episode, all envs
    for monitor in run_dir.glob("*.monitor.csv"):
        lines = monitor.read_text().splitlines()[2:]      # a JSON header, then r,l,t
        episodes_seen += [(float(t), float(r)) for r, _l, t in (x.split(",") for x in lines)]
    returns = [r for _t, r in sorted(episodes_seen)]
    venv.training = False
    successes = 0
    for episode in range(episodes):
        env = FlatObsWrapper(gymnasium.make(DOORKEY_ID))
        obs, _ = env.reset(seed=10_000 + episode)
        done, reward = False, 0.0
        while not done:
            action, _ = model.predict(venv.normalize_obs(obs), deterministic=False)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
        successes += terminated and reward > 0
        env.close()
    venv.close()
    return {"seed": seed, "global_step": model.num_timesteps, "sps": model.num_timesteps / wall,
            "wall_seconds": wall, "returns": returns, "success_rate": successes / episodes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env", choices=["doorkey", "kaz"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--runs", default="runs/learn-any-env")
    parser.add_argument("--out", required=True)
    parser.add_argument("--lib", choices=["peregrine", "sb3"], default="peregrine",
                        help="sb3: SB3 with the RL Zoo's values (doorkey only)")
    args = parser.parse_args()
    if args.lib == "sb3" and args.env != "doorkey":
        parser.error("--lib sb3 runs doorkey only (the RL Zoo has no KAZ values)")
    for seed in args.seeds:
        run_dir = Path(args.runs) / f"{args.env}-{args.lib}-s{seed}"
        if args.lib == "sb3":
            row = {"env": args.env, "library": "sb3", **sb3_doorkey(seed, run_dir)}
            returns = row.pop("returns")
        else:
            row = {"env": args.env, "library": "peregrine", **train_seed(args.env, seed, run_dir)}
            returns = curve(run_dir)
        tenth = max(1, len(returns) // 10)
        row["first_tenth_return"] = float(np.mean(returns[:tenth]))
        row["last_tenth_return"] = float(np.mean(returns[-tenth:]))
        row["improved"] = row["last_tenth_return"] > row["first_tenth_return"]
        if args.env == "doorkey" and args.lib == "peregrine":
            row["success_rate"] = doorkey_success(run_dir)
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
