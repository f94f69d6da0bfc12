"""Peregrine on emulated (Gymnasium) envs against Stable-Baselines3 and Gymnasium's vector envs.

Subcommands (run from the repository root with the project's venv):

  speed    training SPS of Peregrine vs SB3 PPO with the same PPO shape, and env-only SPS
           (random actions) of Peregrine's Multiprocessing vs gymnasium AsyncVectorEnv /
           SyncVectorEnv (and PufferLib when it imports), on LunarLander-v3, HalfCheetah-v5
           and ALE/Pong-v5; back to back in one process, alternating, best of N windows.
      python benchmarks/bench_emulated.py speed --out benchmarks/results/emulated/speed.json

  learn    final deterministic return (50 episodes, fresh seeds), training wall-clock and
           wall-clock to the target of Peregrine (benchmarks/configs/<env>.toml) and SB3 PPO
           (rl-baselines3-zoo hyperparameters) at the same step budget; one JSON line per
           (library, env, seed) appended to --out as each run finishes.
      python benchmarks/bench_emulated.py learn --env lunarlander --seeds 1,2,3 \
          --steps 1000000 --libs peregrine,sb3 --out benchmarks/results/emulated/learn.jsonl

  phases   where one update's time goes (collecting, learning) for both libraries with the
           zoo's PPO shape, envs in-process for both, alternating windows, medians.
      python benchmarks/bench_emulated.py phases --env acrobot --out phases_acrobot.json

  summary  markdown table (every seed, median and worst) of one or more learn JSONL files.
      python benchmarks/bench_emulated.py summary benchmarks/results/emulated/learn*.jsonl

Training processes pin torch to one thread (torch.set_num_threads(1), Peregrine's
train.torch_threads = 1) and should run with OMP_WAIT_POLICY=PASSIVE (set here for the
children when unset).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "configs"

ATARI_WRAPPERS = [{"name": "AtariPreprocessing", "frame_skip": 1},   # v5 already skips 4 frames
                  {"name": "FrameStackObservation", "stack_size": 4}]

# ---- speed: the same PPO shape for both libraries ------------------------------------------
# num_envs: SB3's SubprocVecEnv runs one process per env; Peregrine runs num_workers=2
# processes with num_envs/2 envs each (one per core of this 2-core machine).
SPEED_SETUPS = {
    "lunarlander": dict(env_id="LunarLander-v3", kwargs={}, wrappers=[], cnn=False,
                        num_envs=4, horizon=256, minibatch=256, epochs=4, hidden=64, layers=2,
                        warmup_updates=2, measure_updates=8, env_steps=2000),
    "halfcheetah": dict(env_id="HalfCheetah-v5", kwargs={}, wrappers=[], cnn=False,
                        num_envs=4, horizon=256, minibatch=256, epochs=4, hidden=64, layers=2,
                        warmup_updates=2, measure_updates=8, env_steps=2000),
    "pong": dict(env_id="ALE/Pong-v5", kwargs={}, wrappers=ATARI_WRAPPERS, cnn=True,
                 num_envs=4, horizon=128, minibatch=256, epochs=4, hidden=512, layers=0,
                 warmup_updates=2, measure_updates=3, env_steps=500,
                 # env-only also times ALE's own vector env (C++ threads, 2 here), through
                 # gym-vec: and directly
                 vector_env=True),
}

# ---- learn: rl-baselines3-zoo hyperparams/ppo.yml ---------------------------------------------
# https://github.com/DLR-RM/rl-baselines3-zoo/blob/master/hyperparams/ppo.yml
# (unlisted keys are SB3 PPO defaults: learning_rate 3e-4 constant, batch_size 64,
#  clip_range 0.2, vf_coef 0.5, max_grad_norm 0.5, MlpPolicy 64x64 tanh, separate pi/vf).
ZOO_PPO = {
    # Acrobot-v1: normalize: true (VecNormalize: observations AND rewards, gamma = 0.99),
    # n_envs 16, policy MlpPolicy, n_timesteps 1e6, n_steps 256, gae_lambda 0.94, gamma 0.99,
    # n_epochs 4, ent_coef 0.0
    "acrobot": dict(env_id="Acrobot-v1", normalize=True, n_envs=16, n_timesteps=1_000_000,
                    hyperparams=dict(n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4,
                                     ent_coef=0.0)),
    # LunarLander-v2 / v3 (listed identically): n_envs 16, policy MlpPolicy, n_timesteps 1e6,
    # n_steps 1024, batch_size 64, gae_lambda 0.98, gamma 0.999, n_epochs 4, ent_coef 0.01
    "lunarlander": dict(env_id="LunarLander-v3", normalize=False, n_envs=16,
                        n_timesteps=1_000_000,
                        hyperparams=dict(n_steps=1024, batch_size=64, gae_lambda=0.98,
                                         gamma=0.999, n_epochs=4, ent_coef=0.01)),
    # HalfCheetah-v4 (rl_zoo3 2.9.2's MuJoCo entry; run here on v5): normalize: true, n_envs 1,
    # n_timesteps 1e6, batch_size 64, n_steps 512, gamma 0.98, learning_rate 2.0633e-05,
    # ent_coef 0.000401762, clip_range 0.1, n_epochs 20, gae_lambda 0.92, max_grad_norm 0.8,
    # vf_coef 0.58096, policy_kwargs: log_std_init -2, ortho_init False, ReLU,
    # net_arch pi [256, 256] / vf [256, 256]
    "halfcheetah": dict(env_id="HalfCheetah-v5", normalize=True, n_envs=1,
                        n_timesteps=1_000_000,
                        hyperparams=dict(batch_size=64, n_steps=512, gamma=0.98,
                                         learning_rate=2.0633e-05, ent_coef=0.000401762,
                                         clip_range=0.1, n_epochs=20, gae_lambda=0.92,
                                         max_grad_norm=0.8, vf_coef=0.58096),
                        policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation="relu",
                                           net_arch=dict(pi=[256, 256], vf=[256, 256]))),
    # Hopper-v4 (run here on v5): normalize: true, n_envs 1, n_timesteps 1e6, batch_size 32,
    # n_steps 512, gamma 0.999, learning_rate 9.80828e-05, ent_coef 0.00229519,
    # clip_range 0.2, n_epochs 5, gae_lambda 0.99, max_grad_norm 0.7, vf_coef 0.835671,
    # policy_kwargs as HalfCheetah's
    "hopper": dict(env_id="Hopper-v5", normalize=True, n_envs=1, n_timesteps=1_000_000,
                   hyperparams=dict(batch_size=32, n_steps=512, gamma=0.999,
                                    learning_rate=9.80828e-05, ent_coef=0.00229519,
                                    clip_range=0.2, n_epochs=5, gae_lambda=0.99,
                                    max_grad_norm=0.7, vf_coef=0.835671),
                   policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation="relu",
                                      net_arch=dict(pi=[256, 256], vf=[256, 256]))),
}
# The MuJoCo envs have no threshold: the comparison is with SB3's median (never "reached").
TARGETS = {"lunarlander": 200.0, "acrobot": -100.0, "halfcheetah": float("inf"),
           "hopper": float("inf")}
TARGET_WINDOW = 100          # episodes in the training curve's moving mean
EVAL_SEED = 1000             # eval episodes use seeds 1000.. (never a training seed)


def machine() -> dict:
    import torch
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "loadavg_at_start": os.getloadavg()}


def set_torch_threads() -> None:
    import torch
    torch.set_num_threads(1)


def gym_factory(env_id: str, kwargs: dict, wrappers: list):
    """A picklable maker of one Gymnasium env with `wrappers` applied (for spawned
    SubprocVecEnv / AsyncVectorEnv workers): Peregrine's own EnvFactory, so both
    libraries step the very same env."""
    from peregrine.vector.sources import EnvFactory
    return EnvFactory(f"gym:{env_id}", kwargs, wrappers)


# =============================================================================================
# speed
# =============================================================================================

# Peregrine's ways to run the same training: lib name -> its settings over the setup's.
PEREGRINE_VARIANTS = {
    "peregrine": [],
    # the two workers as halves, each stepped beside the other's forward
    "peregrine_split": [("vec.split", 2)],
    # an actor process steps the envs (in itself) while this one learns
    "peregrine_overlap": [("train.overlap", True), ("vec.backend", "serial"),
                          ("vec.num_workers", 1)],
    # the same, the actor's envs on two worker processes of its own
    "peregrine_overlap_workers": [("train.overlap", True)],
    # the learner on `--learner-threads` torch threads (fp32, then bf16 autocast)
    "peregrine_threads": [],
    "peregrine_threads_bf16": [("train.precision", "bf16")],
}


def peregrine_train_sps(setup: dict, seed: int, run_dir: Path, variant: str = "peregrine") -> dict:
    """Training SPS of Peregrine over `measure_updates` updates after `warmup_updates`,
    from metrics.jsonl (global_step and elapsed of the update records), run as
    PEREGRINE_VARIANTS[variant] says."""
    from peregrine.train.config import load_config
    from peregrine.train.run import train
    batch = setup["num_envs"] * setup["horizon"]
    updates = setup["warmup_updates"] + setup["measure_updates"]
    overrides = [
        ("env.wrappers", setup["wrappers"]),
        ("vec.backend", "multiprocessing"), ("vec.num_envs", setup["num_envs"]),
        ("vec.num_workers", 2),
        ("train.total_steps", batch * updates), ("train.horizon", setup["horizon"]),
        ("train.minibatch_size", setup["minibatch"]), ("train.update_epochs", setup["epochs"]),
        ("train.learning_rate", 3e-4), ("train.anneal_lr", False),
        ("train.torch_threads", 1), ("train.tensorboard", False),
        ("train.checkpoint_interval", 0), ("train.progress_interval", 1000),
        ("train.seed", seed),
        ("policy.num_layers", setup["layers"]),
    ] + PEREGRINE_VARIANTS[variant]
    if not setup["cnn"]:
        overrides += [("policy.hidden_size", setup["hidden"]), ("policy.activation", "tanh")]
    if variant.startswith("peregrine_threads"):
        overrides.append(("train.torch_threads", setup["learner_threads"]))
    config = load_config(f"gym:{setup['env_id']}", None, overrides)
    started = time.perf_counter()
    train(config, run_dir, overwrite=True)
    total = time.perf_counter() - started
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    records = [r for r in records if "global_step" in r and "elapsed" in r]
    first, last = records[setup["warmup_updates"] - 1], records[-1]
    steps = last["global_step"] - first["global_step"]
    seconds = last["elapsed"] - first["elapsed"]
    split = {k: sum(r["time_split"].get(k, 0.0) for r in records[setup["warmup_updates"]:])
             for k in records[-1].get("time_split", {})}
    return {"sps": steps / seconds, "steps": steps, "seconds": seconds,
            "startup_and_total_seconds": total, "time_split_measured": split}


def sb3_train_sps(setup: dict, seed: int, threads: int = 1) -> dict:
    """Training SPS of SB3 PPO (SubprocVecEnv, one process per env): a fresh model learns
    `warmup_updates` rollouts, then `measure_updates` more are timed (model.learn), its
    learner on `threads` torch threads."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv
    import torch
    batch = setup["num_envs"] * setup["horizon"]
    venv = make_vec_env(gym_factory(setup["env_id"], setup["kwargs"], setup["wrappers"]),
                        n_envs=setup["num_envs"], seed=seed, vec_env_cls=SubprocVecEnv,
                        vec_env_kwargs={"start_method": "spawn"})
    try:
        if setup["cnn"]:
            policy, policy_kwargs = "CnnPolicy", {}
        else:
            policy = "MlpPolicy"
            policy_kwargs = dict(net_arch=dict(pi=[setup["hidden"]] * setup["layers"],
                                               vf=[setup["hidden"]] * setup["layers"]),
                                 activation_fn=torch.nn.Tanh)
        torch.set_num_threads(threads)
        model = PPO(policy, venv, n_steps=setup["horizon"], batch_size=setup["minibatch"],
                    n_epochs=setup["epochs"], learning_rate=3e-4, policy_kwargs=policy_kwargs,
                    seed=seed, device="cpu", verbose=0)
        model.learn(batch * setup["warmup_updates"])
        started = time.perf_counter()
        model.learn(batch * setup["measure_updates"], reset_num_timesteps=False)
        seconds = time.perf_counter() - started
    finally:
        torch.set_num_threads(1)
        venv.close()
    steps = batch * setup["measure_updates"]
    return {"sps": steps / seconds, "steps": steps, "seconds": seconds}


def random_actions(space, count: int, rng: np.random.Generator, steps: int) -> list:
    """`steps` arrays of `count` samples of `space` shaped (count, ...)."""
    space.seed(int(rng.integers(1 << 31)))
    return [np.stack([np.asarray(space.sample()) for _ in range(count)]) for _ in range(steps)]


def time_steps(step, actions: list, warmup: int) -> float:
    for a in actions[:warmup]:
        step(a)
    started = time.perf_counter()
    for a in actions[warmup:]:
        step(a)
    return time.perf_counter() - started


def peregrine_env_sps(setup, num_envs, steps, warmup=20) -> float:
    import peregrine.vector as pv
    env = pv.make(f"gym:{setup['env_id']}", backend="multiprocessing", num_envs=num_envs,
                  num_workers=2, seed=0, wrappers=setup["wrappers"], **setup["kwargs"])
    return stepped_sps(env, num_envs, steps, warmup)


def gym_vec_env_sps(setup, num_envs, steps, warmup=20) -> float:
    """The env's own Gymnasium vector env through `gym-vec:` (serial: the vector env's
    threads do the stepping; ALE's does the Atari preprocessing itself)."""
    import peregrine.vector as pv
    env = pv.make(f"gym-vec:{setup['env_id']}", backend="serial", num_envs=num_envs, seed=0,
                  num_threads=2)
    return stepped_sps(env, num_envs, steps, warmup)


def vector_env_sps(setup, num_envs, steps, warmup=20) -> float:
    """The same vector env stepped directly (the peer of the row above)."""
    import gymnasium
    from gymnasium.vector import AutoresetMode
    env = gymnasium.make_vec(setup["env_id"], num_envs=num_envs, num_threads=2,
                             autoreset_mode=AutoresetMode.SAME_STEP)
    return stepped_sps(env, num_envs, steps, warmup)


def stepped_sps(env, num_envs, steps, warmup) -> float:
    """Env steps per second of a vector env stepped with random actions of its own
    action dtype, after `warmup` steps; the env is closed afterwards."""
    try:
        env.reset(seed=0)
        actions = random_actions(env.single_action_space, num_envs, np.random.default_rng(0),
                                 steps + warmup)
        actions = [np.asarray(a).astype(env.single_action_space.dtype) for a in actions]
        seconds = time_steps(env.step, actions, warmup)
    finally:
        env.close()
    return num_envs * steps / seconds


def gymnasium_env_sps(setup, num_envs, steps, asynchronous: bool, warmup=20) -> float:
    import gymnasium
    thunks = [gym_factory(setup["env_id"], setup["kwargs"], setup["wrappers"])
              for _ in range(num_envs)]
    if asynchronous:
        env = gymnasium.vector.AsyncVectorEnv(thunks, context="spawn")
    else:
        env = gymnasium.vector.SyncVectorEnv(thunks)
    return stepped_sps(env, num_envs, steps, warmup)


def pufferlib_env_sps(setup, num_envs, steps, warmup=20) -> float:
    import pufferlib.vector
    creator = PufferCreator(setup)
    env = pufferlib.vector.make(creator, backend=pufferlib.vector.Multiprocessing,
                                num_envs=num_envs, num_workers=2)
    return stepped_sps(env, num_envs, steps, warmup)


class PufferCreator:
    def __init__(self, setup):
        self.setup = setup

    def __call__(self, buf=None, seed=0):
        import pufferlib.emulation
        env = gym_factory(self.setup["env_id"], self.setup["kwargs"], self.setup["wrappers"])()
        return pufferlib.emulation.GymnasiumPufferEnv(env=env, buf=buf, seed=seed)


def pufferlib_status() -> str | None:
    """None when pufferlib imports, else the error line."""
    import importlib
    try:
        importlib.import_module("pufferlib.emulation")
        importlib.import_module("pufferlib.vector")
    except Exception as error:  # noqa: BLE001 - recorded, not raised
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def cmd_speed(args) -> None:
    set_torch_threads()
    envs = args.envs.split(",")
    result = {"machine": machine(), "windows": args.windows, "settings": {}, "train": {},
              "env_only": {}, "skipped": {}, "notes": [
                  "training SPS: steps of the measured updates / their wall time, after "
                  "warm-up updates; start-up (process spawn, model build) excluded",
                  "SB3: SubprocVecEnv (spawn), one process per env; Peregrine: "
                  "vec.backend multiprocessing, num_workers 2 (num_envs/2 envs per worker)",
                  "both: torch.set_num_threads(1), OMP_WAIT_POLICY=PASSIVE, lr 3e-4 constant, "
                  "clip 0.2, MLP = separate actor/critic 64x64 tanh (SB3 MlpPolicy default); "
                  "Pong = Nature CNN 512 features shared, linear heads (SB3 CnnPolicy; "
                  "Peregrine encoder auto + policy.num_layers 0)",
                  "env-only: random actions, same N envs for every backend; Peregrine and "
                  "PufferLib with 2 workers; gymnasium AsyncVectorEnv one process per env",
                  "best (max SPS) of the windows, libraries alternating in each window"]}
    puffer_error = pufferlib_status() if not args.no_puffer else "disabled by --no-puffer"
    if puffer_error:
        result["skipped"]["pufferlib"] = puffer_error
    with tempfile.TemporaryDirectory(prefix="bench_emulated_") as tmp:
        for key in envs:
            setup = dict(SPEED_SETUPS[key])
            if args.num_envs is not None:       # both libraries' training envs
                setup["num_envs"] = args.num_envs
            setup["learner_threads"] = args.learner_threads
            result["settings"][key] = {k: v for k, v in setup.items()}
            result["settings"][key]["env_only_num_envs"] = args.env_num_envs
            libs = ["peregrine", "sb3"] + (["peregrine_split"] if args.split else []) \
                + (["peregrine_overlap"] if args.overlap else []) \
                + (["peregrine_overlap_workers"] if args.overlap_workers else []) \
                + (["peregrine_threads", "peregrine_threads_bf16", "sb3_threads"]
                   if args.learner_threads > 1 else [])
            windows = {lib: [] for lib in libs}
            for window in range(args.windows):
                for lib in (libs if window % 2 == 0 else libs[::-1]):
                    if args.skip_train:
                        continue
                    if lib.startswith("peregrine"):
                        got = recorded(f"[train] {key} window {window} {lib}", lambda: (
                            peregrine_train_sps(setup, window, Path(tmp) / f"{key}-{window}",
                                                lib)))
                    else:
                        threads = args.learner_threads if lib == "sb3_threads" else 1
                        got = recorded(f"[train] {key} window {window} {lib}",
                                       lambda: sb3_train_sps(setup, window, threads))
                    windows[lib].append(got)
            if not args.skip_train:
                result["train"][key] = summarize_windows(windows)
            backends = ["peregrine_mp", "gym_async", "gym_sync"]
            if not puffer_error:
                backends.append("pufferlib_mp")
            if setup.get("vector_env"):     # the env's own vector env: gym-vec: and direct
                backends += ["peregrine_gym_vec", "vector_env"]
            env_windows = {b: [] for b in backends}
            n, steps = args.env_num_envs, setup["env_steps"]
            measure = {"peregrine_mp": lambda: peregrine_env_sps(setup, n, steps),
                       "gym_async": lambda: gymnasium_env_sps(setup, n, steps, True),
                       "gym_sync": lambda: gymnasium_env_sps(setup, n, steps, False),
                       "pufferlib_mp": lambda: pufferlib_env_sps(setup, n, steps),
                       "peregrine_gym_vec": lambda: gym_vec_env_sps(setup, n, steps),
                       "vector_env": lambda: vector_env_sps(setup, n, steps)}
            for window in range(0 if args.skip_env_only else args.windows):
                order = backends if window % 2 == 0 else backends[::-1]
                for backend in order:
                    env_windows[backend].append(recorded(
                        f"[env] {key} window {window} {backend}",
                        lambda: {"sps": measure[backend]()}))
            if not args.skip_env_only:
                result["env_only"][key] = summarize_windows(env_windows)
            write_json(args.out, result)       # partial results survive
    result["loadavg_at_end"] = os.getloadavg()
    write_json(args.out, result)
    print(speed_markdown(result))


def recorded(label: str, measure) -> dict:
    """measure() -> {"sps": ...}; a failure is recorded as {"sps": None, "error"} (the
    next window still runs) and the figure is printed under `label`."""
    try:
        got = measure()
    except Exception as error:  # noqa: BLE001 - recorded
        import traceback
        traceback.print_exc()
        got = {"sps": None, "error": f"{type(error).__name__}: {error}"}
    print(f"{label}: {got['sps'] if got['sps'] is None else round(got['sps'])} SPS", flush=True)
    return got


def summarize_windows(windows: dict) -> dict:
    out = {}
    for lib, runs in windows.items():
        values = [r["sps"] for r in runs if r.get("sps")]
        out[lib] = {"best_sps": max(values) if values else None,
                    "all_sps": [r.get("sps") for r in runs],
                    "errors": [r["error"] for r in runs if "error" in r] or None,
                    "windows": runs}
    return out


def write_json(path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def speed_markdown(result: dict) -> str:
    lines = ["### Training SPS (best of %d windows)" % result["windows"], "",
             "| env | num_envs | horizon | minibatch | epochs | policy | Peregrine SPS | "
             "SB3 SPS | Peregrine / SB3 |", "|---|---|---|---|---|---|---|---|---|"]
    for key, row in result["train"].items():
        s = result["settings"][key]
        pg, sb = row["peregrine"]["best_sps"], row["sb3"]["best_sps"]
        policy = "Nature CNN" if s["cnn"] else f"MLP {s['hidden']}x{s['layers']} tanh"
        lines.append(f"| {s['env_id']} | {s['num_envs']} | {s['horizon']} | {s['minibatch']} | "
                     f"{s['epochs']} | {policy} | {fmt(pg)} | {fmt(sb)} | {ratio(pg, sb)} |")
        for lib, label in (("peregrine_split", "vec.split 2"),
                           ("peregrine_overlap", "train.overlap"),
                           ("peregrine_overlap_workers", "train.overlap, 2 workers in the actor")):
            if lib in row:
                other = row[lib]["best_sps"]
                lines.append(f"| ({label}) | | | | | | {fmt(other)} | | {ratio(other, sb)}; "
                             f"/ plain Peregrine {ratio(other, pg)} |")
        if "sb3_threads" in row:
            threads = s.get("learner_threads")
            sb_t = row["sb3_threads"]["best_sps"]
            for lib, label in (("peregrine_threads", f"{threads} learner threads"),
                               ("peregrine_threads_bf16", f"{threads} learner threads, bf16")):
                other = row[lib]["best_sps"]
                lines.append(f"| ({label}) | | | | | | {fmt(other)} | {fmt(sb_t)} | "
                             f"{ratio(other, sb_t)} |")
    if not result["env_only"]:
        return "\n".join(lines)
    lines += ["", "### Env-only SPS, random actions (best of %d windows)" % result["windows"], ""]
    backends = sorted({b for row in result["env_only"].values() for b in row},
                      key=["peregrine_mp", "gym_async", "gym_sync", "pufferlib_mp",
                           "peregrine_gym_vec", "vector_env"].index)
    lines.append("| env | N | " + " | ".join(backends) + " | Peregrine / Async | "
                 "Peregrine / Sync |")
    lines.append("|---|---|" + "---|" * (len(backends) + 2))
    for key, row in result["env_only"].items():
        s = result["settings"][key]
        best = {b: row[b]["best_sps"] for b in row}
        lines.append(f"| {s['env_id']} | {s['env_only_num_envs']} | "
                     + " | ".join(fmt(best.get(b)) for b in backends)
                     + f" | {ratio(best.get('peregrine_mp'), best.get('gym_async'))} | "
                     f"{ratio(best.get('peregrine_mp'), best.get('gym_sync'))} |")
    for name, why in result.get("skipped", {}).items():
        lines.append(f"\nskipped {name}: {why}")
    return "\n".join(lines)


def fmt(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


# =============================================================================================
# learn
# =============================================================================================

def moving_target_time(points: list, target: float, window: int = TARGET_WINDOW):
    """First (seconds, step) at which the mean return of the last `window` episodes
    reaches `target`; `points` are (seconds, step, [(count, mean), ...] of the episodes
    since the previous point). Never reached -> (None, None)."""
    history = []             # (count, mean) per point, oldest first
    for seconds, step, chunks in points:
        history.extend(chunks)
        count, total = 0, 0.0
        for episodes, mean in reversed(history):
            take = min(episodes, window - count)
            count += take
            total += take * mean
            if count >= window:
                break
        if count >= window and total / count >= target:
            return seconds, step
    return None, None


def learn_peregrine(key: str, seed: int, steps: int, run_dir: Path, config_file: Path,
                    overrides=()) -> dict:
    """`overrides`: ("SECTION.KEY", "VALUE") pairs over the config file (--set)."""
    from peregrine.train.config import load_config
    from peregrine.train.run import train
    env_name = f"gym:{ZOO_PPO[key]['env_id']}"
    config = load_config(env_name, str(config_file), [*overrides, ("train.seed", seed),
                                                      ("train.total_steps", steps),
                                                      ("train.tensorboard", False)])
    started = time.perf_counter()
    summary = train(config, run_dir, overwrite=True)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    records = [r for r in records if "global_step" in r]
    points = [(r["elapsed"], r["global_step"],
               [(r["episodes_this_update"], r["episode_return"])]
               if r.get("episodes_this_update") else []) for r in records]
    target = TARGETS[key]
    target_seconds, target_step = moving_target_time(points, target)
    final_curve = curve_mean(points)
    out = subprocess.run([sys.executable, "-m", "peregrine.cli", "eval", "--policy", str(run_dir),
                          "--episodes", "50", "--seed", str(EVAL_SEED), "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"peregrine eval failed: {out.stderr.strip()[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"eval_return": result["mean"]["episode_return"],
            "eval_return_std": result["std"]["episode_return"],
            "eval_episodes": result["episodes"],
            "train_wall_seconds": wall, "train_loop_seconds": summary["elapsed"],
            "sps": summary["sps"], "global_step": summary["global_step"],
            "target": target, "target_seconds": target_seconds, "target_step": target_step,
            "final_curve_return_100": final_curve,
            "config": str(config_file.relative_to(ROOT)) if config_file.is_relative_to(ROOT)
            else str(config_file)}


def curve_mean(points, window: int = TARGET_WINDOW):
    history = [c for _, _, chunks in points for c in chunks]
    count, total = 0, 0.0
    for episodes, mean in reversed(history):
        take = min(episodes, window - count)
        count, total = count + take, total + take * mean
        if count >= window:
            break
    return total / count if count else None


def sb3_zoo_model(key: str, seed: int):
    """SB3 PPO with the zoo's values for `key`, and its vec env (DummyVecEnv, the zoo's
    default, one process; Monitor added by make_vec_env; VecNormalize where the zoo
    normalises)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    zoo = ZOO_PPO[key]
    hyper = dict(zoo["hyperparams"])
    venv = make_vec_env(gym_factory(zoo["env_id"], {}, []), n_envs=zoo["n_envs"], seed=seed,
                        vec_env_cls=DummyVecEnv)
    if zoo["normalize"]:
        venv = VecNormalize(venv, gamma=hyper["gamma"])     # zoo: normalize_kwargs gamma
    policy_kwargs = dict(zoo.get("policy_kwargs", {}))
    if policy_kwargs.get("activation") == "relu":
        import torch
        policy_kwargs["activation_fn"] = torch.nn.ReLU
    policy_kwargs.pop("activation", None)
    if policy_kwargs:
        hyper["policy_kwargs"] = policy_kwargs
    return PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **hyper), venv


def learn_sb3(key: str, seed: int, steps: int) -> dict:
    from stable_baselines3.common.callbacks import BaseCallback
    zoo = ZOO_PPO[key]
    target = TARGETS[key]

    class Curve(BaseCallback):
        """The training curve: at each rollout's end, SB3's own moving mean return over
        the last 100 episodes (ep_info_buffer, from the Monitor wrappers)."""

        def __init__(self):
            super().__init__()
            self.started = None
            self.target_seconds = self.target_step = None
            self.last = None

        def _on_training_start(self):
            self.started = time.perf_counter()

        def _on_step(self):
            return True

        def _on_rollout_end(self):
            buffer = self.model.ep_info_buffer
            if buffer is not None and len(buffer) >= TARGET_WINDOW:
                mean = float(np.mean([info["r"] for info in buffer]))
                self.last = mean
                if self.target_seconds is None and mean >= target:
                    self.target_seconds = time.perf_counter() - self.started
                    self.target_step = self.num_timesteps

    started = time.perf_counter()
    model, venv = sb3_zoo_model(key, seed)
    curve = Curve()
    loop_started = time.perf_counter()
    model.learn(steps, callback=curve)
    loop = time.perf_counter() - loop_started
    wall = time.perf_counter() - started
    obs_rms = venv.obs_rms if zoo["normalize"] else None
    venv.close()
    returns = sb3_eval(model, zoo["env_id"], obs_rms, venv if zoo["normalize"] else None)
    return {"eval_return": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
            "eval_episodes": len(returns), "train_wall_seconds": wall,
            "train_loop_seconds": loop, "sps": steps / loop, "global_step": model.num_timesteps,
            "target": target, "target_seconds": curve.target_seconds,
            "target_step": curve.target_step, "final_curve_return_100": curve.last,
            "hyperparams": {**zoo["hyperparams"], "policy_kwargs": zoo.get("policy_kwargs"),
                            "n_envs": zoo["n_envs"], "normalize": zoo["normalize"],
                            "vec_env": "DummyVecEnv",
                            "source": "rl-baselines3-zoo hyperparams/ppo.yml"}}


def sb3_eval(model, env_id: str, obs_rms, vecnorm, episodes: int = 50) -> list:
    """Deterministic returns of `episodes` episodes, episode i reset with seed EVAL_SEED + i
    (observations normalised with the training statistics, frozen)."""
    import gymnasium
    env = gymnasium.make(env_id)
    returns = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=EVAL_SEED + i)
            total, done = 0.0, False
            while not done:
                x = obs if vecnorm is None else vecnorm.normalize_obs(obs)
                action, _ = model.predict(x, deterministic=True)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns


def cmd_learn(args) -> None:
    set_torch_threads()
    seeds = [int(s) for s in args.seeds.split(",")]
    libs = args.libs.split(",")
    config_file = Path(args.config) if args.config else CONFIGS / f"{args.env}.toml"
    run_root = Path(args.run_root)
    from peregrine.train.config import parse_override_tokens
    try:        # the command line's own parser: --set policy.init=torch is --policy.init=torch
        overrides = parse_override_tokens(f"--{item}" for item in args.set)
    except ValueError as error:
        raise SystemExit(f"--set takes SECTION.KEY=VALUE: {error}") from None
    label = f"-{args.tag}" if args.tag else ""
    for seed in seeds:
        for lib in libs:
            row = {"library": lib, "env": args.env, "env_id": ZOO_PPO[args.env]["env_id"],
                   "seed": seed, "steps": args.steps, "tag": args.tag,
                   "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                   "loadavg_at_start": os.getloadavg()}
            try:
                if lib == "peregrine":
                    if overrides:
                        row["overrides"] = dict(overrides)
                    row.update(learn_peregrine(args.env, seed, args.steps,
                                               run_root / f"peregrine-{args.env}{label}-s{seed}",
                                               config_file, overrides))
                elif lib == "sb3":
                    row.update(learn_sb3(args.env, seed, args.steps))
                else:
                    raise ValueError(f"unknown library {lib!r}")
            except Exception:  # noqa: BLE001 - recorded, the next run goes on
                import traceback
                row["error"] = traceback.format_exc()
                print(row["error"], file=sys.stderr)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(json.dumps({k: row.get(k) for k in ("library", "env", "seed", "eval_return",
                                                       "train_wall_seconds", "target_seconds",
                                                       "error")}), flush=True)


# =============================================================================================
# phases: where an update's time goes, both libraries, the zoo's PPO shape
# =============================================================================================

def cmd_phases(args) -> None:
    """Both learners built with the zoo's values for --env (Peregrine from
    benchmarks/configs/<env>.toml, its envs stepped in-process as SB3's DummyVecEnv does),
    then alternating windows of one update each: Peregrine's own time split (env, forward,
    learn) and SB3's rollout and train() timed apart. Medians over the windows."""
    set_torch_threads()
    from peregrine.train.config import load_config
    from peregrine.train.ppo import Trainer
    config_file = Path(args.config) if args.config else CONFIGS / f"{args.env}.toml"
    config = load_config(f"gym:{ZOO_PPO[args.env]['env_id']}", str(config_file),
                         [("vec.backend", "serial"), ("train.seed", 1),
                          ("train.tensorboard", False)])
    trainer = Trainer(config)
    model, venv = sb3_zoo_model(args.env, 1)
    samples = model.n_steps * model.n_envs
    model.learn(samples)                      # warm-up: one rollout and train() each
    trainer.update()
    peregrine, sb3 = [], []
    for _ in range(args.windows):
        split = trainer.update()["time_split"]
        peregrine.append({"collect": split["env"] + split["forward"], "learn": split["learn"]})
        started = time.perf_counter()
        model.learn(samples, reset_num_timesteps=False)        # one rollout + one train()
        both = time.perf_counter() - started
        started = time.perf_counter()
        model.train()                                           # train() alone, timed
        train = time.perf_counter() - started
        sb3.append({"collect": both - train, "learn": train})
    trainer.close()
    venv.close()
    minibatches = config.train.update_epochs * (samples // config.train.minibatch_size)
    result = {"env": args.env, "samples_per_update": samples, "minibatches": minibatches,
              "windows": args.windows, "machine": machine()}
    for name, rows in (("peregrine", peregrine), ("sb3", sb3)):
        result[name] = {phase: statistics.median(row[phase] for row in rows)
                        for phase in ("collect", "learn")}
    write_json(args.out, result)
    p, b = result["peregrine"], result["sb3"]
    print(f"{args.env}: {samples} samples, {minibatches} minibatches per update (medians of "
          f"{args.windows})\n| phase | Peregrine s | SB3 s | Peregrine / SB3 |\n|---|---:|---:|---:|")
    for phase in ("collect", "learn"):
        print(f"| {phase} | {p[phase]:.3f} | {b[phase]:.3f} | {p[phase] / b[phase]:.2f}x |")
    total_p, total_b = p["collect"] + p["learn"], b["collect"] + b["learn"]
    print(f"| update | {total_p:.3f} | {total_b:.3f} | {total_p / total_b:.2f}x |")


# =============================================================================================
# summary
# =============================================================================================

def cmd_summary(args) -> None:
    rows = []
    for path in args.files:
        rows += [json.loads(line) for line in open(path) if line.strip()]
    if args.tag is not None:
        rows = [r for r in rows if r.get("tag") == args.tag]
    groups = {}
    for r in rows:
        groups.setdefault((r["env"], r["library"], r["steps"], r.get("tag") or ""), []).append(r)
    lines = ["| env | library | steps | tag | seed | eval return (50 ep) | train wall s | "
             "wall s to target | step at target |", "|---|---|---|---|---|---|---|---|---|"]
    for (env, lib, steps, tag), group in sorted(groups.items()):
        group.sort(key=lambda r: r["seed"])
        for r in group:
            if "error" in r:
                lines.append(f"| {env} | {lib} | {steps:,} | {tag} | {r['seed']} | ERROR | | | |")
                continue
            lines.append(f"| {env} | {lib} | {steps:,} | {tag} | {r['seed']} | {r['eval_return']:.1f} | "
                         f"{opt(r['train_wall_seconds'], '-')} | {opt(r['target_seconds'])} | "
                         f"{opt(r['target_step'])} |")
        ok = [r for r in group if "error" not in r]
        if ok:
            evals = [r["eval_return"] for r in ok]
            walls = [r["train_wall_seconds"] for r in ok if r["train_wall_seconds"] is not None]
            hits = [r["target_seconds"] for r in ok if r["target_seconds"] is not None]
            lines.append(f"| {env} | {lib} | {steps:,} | {tag} | **median / worst (n={len(ok)})** | "
                         f"**{statistics.median(evals):.1f} / {min(evals):.1f}** | "
                         + (f"{statistics.median(walls):.0f} / {max(walls):.0f} | " if walls
                            else "- | ")
                         + f"{len(hits)}/{len(ok)} reached"
                         + (f", median {statistics.median(hits):.0f}" if hits else "")
                         + " | |")
    print("\n".join(lines))


def opt(value, none: str = "never") -> str:
    if value is None:
        return none
    return f"{value:,.0f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    speed = sub.add_parser("speed", help="training and env-only SPS")
    speed.add_argument("--out", required=True, help="JSON file to write")
    speed.add_argument("--envs", default="lunarlander,halfcheetah,pong",
                       help=f"comma list of {list(SPEED_SETUPS)}")
    speed.add_argument("--windows", type=int, default=3)
    speed.add_argument("--env-num-envs", type=int, default=8,
                       help="N envs for the env-only comparison")
    speed.add_argument("--num-envs", type=int, default=None,
                       help="training envs for both libraries (default: each setup's 4)")
    speed.add_argument("--no-puffer", action="store_true")
    speed.add_argument("--skip-train", action="store_true")
    speed.add_argument("--skip-env-only", action="store_true")
    speed.add_argument("--split", action="store_true",
                       help="also train Peregrine with vec.split 2 (its two workers as halves)")
    speed.add_argument("--overlap", action="store_true",
                       help="also train Peregrine with train.overlap (an actor process steps "
                            "the envs while this one learns)")
    speed.add_argument("--learner-threads", type=int, default=1, metavar="N",
                       help="N > 1: also train both libraries with N torch threads in the "
                            "learner, and Peregrine with N threads and bf16 autocast")
    speed.add_argument("--overlap-workers", action="store_true",
                       help="also train Peregrine with train.overlap and the actor's envs on "
                            "2 worker processes (vec.backend multiprocessing)")
    speed.set_defaults(func=cmd_speed)
    learn = sub.add_parser("learn", help="learning curves and final returns")
    learn.add_argument("--env", required=True, choices=sorted(ZOO_PPO))
    learn.add_argument("--seeds", required=True, help="comma list, e.g. 1,2,3,4,5")
    learn.add_argument("--steps", type=int, required=True)
    learn.add_argument("--libs", default="peregrine,sb3")
    learn.add_argument("--config", default=None,
                       help="Peregrine config (default benchmarks/configs/<env>.toml)")
    learn.add_argument("--run-root", default=os.path.join(tempfile.gettempdir(),
                                                          "bench_emulated_runs"),
                       help="where Peregrine's run directories go (not the repository)")
    learn.add_argument("--tag", default=None, help="free label stored in each row (and in "
                                                   "Peregrine's run directory name)")
    learn.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="Peregrine config value over --config, e.g. policy.init=torch "
                            "(repeatable; stored in each row)")
    learn.add_argument("--out", required=True, help="JSONL file to append to")
    learn.set_defaults(func=cmd_learn)
    phases = sub.add_parser("phases", help="time per update phase, both libraries")
    phases.add_argument("--env", required=True, choices=sorted(ZOO_PPO))
    phases.add_argument("--config", default=None,
                        help="Peregrine config (default benchmarks/configs/<env>.toml)")
    phases.add_argument("--windows", type=int, default=5)
    phases.add_argument("--out", required=True, help="JSON file to write")
    phases.set_defaults(func=cmd_phases)
    summary = sub.add_parser("summary", help="markdown table of learn JSONL files")
    summary.add_argument("files", nargs="+")
    summary.add_argument("--tag", default=None)
    summary.set_defaults(func=cmd_summary)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
