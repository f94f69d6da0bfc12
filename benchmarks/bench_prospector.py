"""Prospector: env throughput (1 and 2 threads) and the baseline policies' returns.

    .venv/bin/python benchmarks/bench_prospector.py [--num-envs 8192] [--seconds 3]
                                                    [--episodes 256] [--seed 0]
                                                    [--checkpoint RUN_DIR_OR_FILE]
                                                    [--skip-throughput]
                                                    [--curves RUN_DIR ... --plot PNG]

Throughput is `peregrine bench`'s loop (random actions pre-generated, one C
call per step) with two additions for a shared machine: CPU seconds are read
beside wall seconds, so "steps per CPU-second" does not depend on how busy
the other cores are, and CartPole is measured in the same run as a
reference point. Baselines: `peregrine.evaluate` plays the first episode of
`--episodes` instances (seed `--seed`) with the masked-random policy and the
scripted trader; with `--checkpoint`, a trained policy too (its argmax over
the valid actions, and a masked sample as in training), always on the default game
(no shaping), whatever config it was trained with.

`--curves RUN_DIR [RUN_DIR ...] --plot PNG` draws the training runs' learning
curves on the default game's scale beside the two baselines, with each run's
final checkpoint evaluated like the baselines as a marker. A run may train
with shaping or another death penalty, so its logged episode return is not
the game's; the game's return is linear in three episode statistics the env
logs per update, so their means give the mean game return exactly:
`(credits - start_credits) * reward_scale - death_penalty * (destroyed +
out_of_fuel)` with the default game's constants.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

import peregrine
from peregrine.profile.bench import action_pool
from peregrine.evaluate import evaluate


def throughput(name: str, num_envs: int, threads: int, seconds: float) -> dict:
    env = peregrine.make(name, num_envs=num_envs, seed=0, num_threads=threads)
    try:
        actions = action_pool(env, 16)
        for batch in actions:  # warm-up
            env.step(batch)
        steps, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - wall0 < seconds:
            for batch in actions:
                env.step(batch)
            steps += len(actions)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        env.close()
    total = steps * num_envs
    return {"env": name, "threads": threads, "num_envs": num_envs,
            "env_steps_per_sec": total / wall, "env_steps_per_cpu_sec": total / cpu,
            "cpu_ns_per_step": 1e9 * cpu / total, "cpus_busy": cpu / wall}


def checkpoint_policies(path: str) -> dict:
    """The trained actor as plain argmax and as argmax over the masked logits."""
    import torch

    from peregrine.train.checkpoint import Actor, load_actor

    probe = peregrine.make("prospector", num_envs=1, seed=0)
    actor = load_actor(path, probe)  # argmax over the valid actions (the env's mask)
    probe.close()
    sampler = Actor(actor.policy, probe.single_action_space, actor.obs_normalizer,
                    actor.mask_slice, generator=torch.Generator().manual_seed(0))
    return {"trained (argmax)": actor, "trained (sampled, as in training)": sampler}


def game_return_curve(run_dir: str):
    """(env steps, mean default-game return of the training episodes) per update."""
    from peregrine.envs.prospector import Prospector
    from peregrine.monitor.plots import read_jsonl
    game = Prospector.resolve_config({})
    steps, returns = [], []
    for record in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        stats = record.get("env_stats") or {}
        if not record.get("episodes_this_update") or "credits" not in stats:
            continue
        steps.append(record["global_step"])
        returns.append((stats["credits"] - game["start_credits"]) * game["reward_scale"]
                       - game["death_penalty"] * (stats["destroyed"] + stats["out_of_fuel"]))
    return steps, returns


def plot_curves(run_dirs, baselines: dict, path: str, episodes: int, seed: int) -> None:
    """Each run's curve (training episodes, sampled actions, smoothed) and a marker
    at its end for its final checkpoint's argmax evaluation, beside the baselines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    for run_dir in run_dirs:
        name = os.path.basename(os.path.normpath(run_dir))
        steps, returns = game_return_curve(run_dir)
        window = max(1, len(returns) // 60)
        smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
        line, = axis.plot(np.asarray(steps[window - 1:]) / 1e6, smooth,
                          label=f"{name}: training episodes (sampled)")
        final = evaluate("prospector", run_dir, episodes, seed)["mean"]["episode_return"]
        axis.plot([steps[-1] / 1e6], [final], "o", color=line.get_color(),
                  label=f"{name}: final checkpoint, argmax: {final:.2f}")
    for (name, result), style in zip(baselines.items(), ("k:", "k--", "r:", "r--")):
        axis.axhline(result["mean"]["episode_return"], color=style[0], linestyle=style[1:],
                     label=f"{name}: {result['mean']['episode_return']:.2f}")
    axis.set_xlabel("env steps (millions)")
    axis.set_ylabel("return, default game")
    axis.set_title("Prospector: PPO vs the scripted trader")
    axis.legend(fontsize=7, loc="lower right")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=8192)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="also evaluate this trained policy")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--curves", nargs="+", metavar="RUN_DIR",
                        help="training runs whose learning curves --plot draws")
    parser.add_argument("--plot", help="PNG for --curves, with the baselines as lines")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} (shared machine)")
    rows = []
    if not args.skip_throughput:
        rows.append(throughput("cartpole", args.num_envs, 1, args.seconds))
        for threads in (1, 2):
            rows.append(throughput("prospector", args.num_envs, threads, args.seconds))
    for row in rows:
        print(f"{row['env']:>10} {row['threads']} thread(s) {row['num_envs']} envs: "
              f"{row['env_steps_per_sec']:>13,.0f} env steps/s wall, "
              f"{row['env_steps_per_cpu_sec']:>13,.0f} per CPU-second "
              f"({row['cpu_ns_per_step']:.0f} ns CPU/step, {row['cpus_busy']:.2f} CPUs busy)")
    if rows:
        print(f"prospector/cartpole per CPU-second (1 thread): "
              f"{rows[1]['env_steps_per_cpu_sec'] / rows[0]['env_steps_per_cpu_sec']:.3f}")

    baselines = {name: evaluate("prospector", policy, args.episodes, args.seed)
                 for name, policy in (("random", "random"), ("scripted", "trader"))}
    if args.checkpoint:
        for name, policy in checkpoint_policies(args.checkpoint).items():
            baselines[name] = evaluate("prospector", policy, args.episodes, args.seed)
    for name, result in baselines.items():
        mean, std = result["mean"], result["std"]
        print(f"{name:>15}: return {mean['episode_return']:7.2f} ± {std['episode_return']:5.2f} "
              f"over {result['episodes']} first episodes (seed {args.seed}); length "
              f"{mean['episode_length']:.0f}, credits {mean['credits']:.0f}, destroyed "
              f"{mean['destroyed']:.1%}, out of fuel {mean['out_of_fuel']:.1%}; "
              f"ore sold {mean['ore_sold']:.1f}, invalid actions {mean['invalid_actions']:.1f}")
    if args.curves and args.plot:
        plot_curves(args.curves, {"scripted trader": baselines["scripted"],
                                  "random": baselines["random"]}, args.plot,
                    args.episodes, args.seed)
    if args.json:
        print(json.dumps({"throughput": rows, "baselines": baselines}))


if __name__ == "__main__":
    main()
