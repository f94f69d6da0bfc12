"""CartPole-v1 written directly in batched PyTorch, timed beside Peregrine's CartPole.

    .venv/bin/python benchmarks/torch_cartpole.py --device cuda --sizes 4096 65536 1048576
    .venv/bin/python benchmarks/torch_cartpole.py --device cpu --sizes 64 --seconds 0.2 --mode both
    .venv/bin/python benchmarks/torch_cartpole.py --mode train --sizes 65536 \\
        --set train.minibatch_size=262144 --json out.json

`TorchCartPole` is what a user would write without Peregrine: Gymnasium's
CartPole-v1 (the same constants, Euler integration, termination at |x| > 2.4 or
|theta| > 12 degrees, truncation after 500 steps, reward 1 per step, reset state
uniform in [-0.05, 0.05]) as plain tensor ops over a batch on any device, finished
instances reset with `torch.where`, randomness from one `torch.Generator` on the
device. No custom kernels, no CUDA graphs, no compilation: the peer, not a tuned
rival. Like Peregrine's CartPole, an episode that ends on its 500th step by
falling is terminal only (not also truncated).

Modes (`--mode env|train|both`), each measured for both implementations in the
same invocation, so their ratio is taken on the same machine at the same time:

* env: agent steps/s of `step` alone, fixed random actions already on the device,
  a loop of step calls, one synchronisation at the end (bench_gpu.py's `timed`);
  Peregrine's row is `peregrine.make("cartpole", num_envs=N, seed=0, device=D)`
  timed by bench_gpu.py's `measure_device`.
* train: training samples/s of Peregrine's PPO Trainer with `cartpole --config fast`,
  vec.backend = "device" and train.device = D (plus any `--set` overrides),
  vec.num_envs = N: once on Peregrine's device CartPole, once on the torch CartPole
  through `TrainerEnv` (the thin adapter to the batch interface the Trainer steps).
  One warm-up update untimed, then updates until `--seconds` pass, then a
  synchronisation.

On the CPU both sides run on one thread (torch.set_num_threads(1); the device
batch's num_threads = 1; the fast config's train.torch_threads = 1).

`--json OUT` is rewritten after every row; a row is
{"mode": "env"|"train", "impl": "torch"|"peregrine", "instances", "sps", "device",
"seconds", ...} (env rows add "calls"; train rows add "updates", "warmup_seconds",
"recent_return", "overrides").
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch
from gymnasium import spaces

from bench_gpu import measure_device, timed, write_json
from peregrine.envs.native.batch import EpisodeStats

# Gymnasium's CartPole-v1 constants.
GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5                                   # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02                                     # seconds per step
THETA_THRESHOLD = 12 * 2 * math.pi / 360       # 12 degrees, in radians
X_THRESHOLD = 2.4
MAX_STEPS = 500


class TorchCartPole:
    """`num_envs` CartPole-v1 instances as tensors on `device`.

    `state` is [num_envs, 4] float32 (x, x_dot, theta, theta_dot), which is also
    the observation; `steps` [num_envs] int32 counts each episode's steps.
    """

    def __init__(self, num_envs: int, device="cpu", seed: int = 0):
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.state = torch.zeros(num_envs, 4, device=self.device)
        self.steps = torch.zeros(num_envs, dtype=torch.int32, device=self.device)
        self.reset()

    def _initial_states(self) -> torch.Tensor:
        """A fresh state for every instance, uniform in [-0.05, 0.05)."""
        uniform = torch.rand(self.num_envs, 4, generator=self.generator, device=self.device)
        return uniform * 0.1 - 0.05

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self.state = self._initial_states()
        self.steps.zero_()
        return self.state

    def step(self, actions: torch.Tensor):
        """Steps every instance with `actions` (0 = push left, 1 = push right) and
        resets the finished ones. Returns (observations, rewards, terminated,
        truncated, final_observations): the observations are after the reset, the
        final observations before it (what a truncated episode is bootstrapped on)."""
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(actions == 1, FORCE_MAG, -FORCE_MAG)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + POLEMASS_LENGTH * theta_dot * theta_dot * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * costheta * costheta / TOTAL_MASS))
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        # Euler integration, as Gymnasium's default kinematics_integrator.
        x = x + TAU * x_dot
        x_dot = x_dot + TAU * xacc
        theta = theta + TAU * theta_dot
        theta_dot = theta_dot + TAU * thetaacc
        final = torch.stack([x, x_dot, theta, theta_dot], dim=1)
        self.steps += 1

        terminated = (x.abs() > X_THRESHOLD) | (theta.abs() > THETA_THRESHOLD)
        truncated = ~terminated & (self.steps >= MAX_STEPS)
        done = terminated | truncated
        # Auto-reset: every row draws a fresh state, the finished rows take it.
        self.state = torch.where(done.unsqueeze(1), self._initial_states(), final)
        self.steps = torch.where(done, 0, self.steps)
        rewards = torch.ones(self.num_envs, device=self.device)
        return self.state, rewards, terminated, truncated, final


class TrainerEnv:
    """TorchCartPole behind the batch interface Peregrine's Trainer steps (the one
    DeviceEnv has): fixed tensor buffers updated in place by `step` (the trainer
    keeps views of them), the spaces, and episode statistics summed on the device
    and read once per update. No stream seeding or per-instance state, so the
    trainer does not resume it exactly (it does not need to here)."""

    stat_names = ("episode_return", "episode_length")
    agents_per_env = 1

    def __init__(self, num_envs: int, device="cpu", seed: int = 0):
        self.env = TorchCartPole(num_envs, device, seed)
        self.device = self.env.device
        self.num_envs = self.num_agents = num_envs
        high = np.array([2 * X_THRESHOLD, np.inf, 2 * THETA_THRESHOLD, np.inf], np.float32)
        self.single_observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = spaces.Discrete(2)

        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(*shape, dtype=dtype, device=self.device)
        self.observations, self.final_observations = zeros(num_envs, 4), zeros(num_envs, 4)
        self.actions = zeros(num_envs, dtype=torch.int64)
        self.rewards = zeros(num_envs)
        self.terminals = zeros(num_envs, dtype=torch.bool)
        self.truncations = zeros(num_envs, dtype=torch.bool)
        self.masks = torch.ones(num_envs, dtype=torch.bool, device=self.device)
        # Running return and length per instance, and over finished episodes:
        # [count, sum of returns, sum of lengths, sum of squared returns, ... lengths].
        self._returns, self._lengths = zeros(num_envs), zeros(num_envs)
        self._totals = zeros(5, dtype=torch.float64)
        self.observations.copy_(self.env.state)

    def reset(self, seed: int | None = None):
        self.observations.copy_(self.env.reset(seed))
        self._returns.zero_()
        self._lengths.zero_()
        return self.observations, {}

    def step(self, actions: torch.Tensor):
        observations, rewards, terminated, truncated, final = self.env.step(actions)
        self.observations.copy_(observations)
        self.final_observations.copy_(final)
        self.rewards.copy_(rewards)
        self.terminals.copy_(terminated)
        self.truncations.copy_(truncated)
        self._returns += rewards
        self._lengths += 1
        ended = (terminated | truncated).to(torch.float64)
        episode = torch.stack([self._returns, self._lengths]).to(torch.float64) * ended
        self._totals[0] += ended.sum()
        self._totals[1:3] += episode.sum(dim=1)
        self._totals[3:5] += (episode * episode).sum(dim=1)
        still = 1.0 - ended.to(torch.float32)
        self._returns *= still
        self._lengths *= still
        return self.observations, self.rewards, self.terminals, self.truncations, {}

    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        totals = self._totals.tolist()
        if clear:
            self._totals.zero_()
        return EpisodeStats.from_sums(self.stat_names, int(totals[0]), totals[1:3], totals[3:5])

    def close(self) -> None:
        """Nothing to release (the tensors go with the object)."""


def synchroniser(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


# ---- env-only -------------------------------------------------------------------------

def measure_torch_env(num_envs: int, seconds: float, device) -> dict:
    env = TorchCartPole(num_envs, device, seed=0)
    actions = torch.randint(0, 2, (num_envs,), generator=env.generator, device=env.device)
    calls, elapsed = timed(lambda: env.step(actions), seconds, synchroniser(env.device))
    return {"sps": calls * num_envs / elapsed, "calls": calls, "seconds": elapsed}


def measure_peregrine_env(num_envs: int, seconds: float, device) -> dict:
    started = time.perf_counter()
    sps = measure_device("cartpole", num_envs, seconds, torch, str(device))
    return {"sps": sps, "seconds": time.perf_counter() - started}


# ---- training ------------------------------------------------------------------------

def train_config(num_envs: int, device, overrides=()):
    """`cartpole --config fast` on the device loop with `num_envs` instances."""
    from peregrine.train.config import load_config
    return load_config("cartpole", "fast", overrides=[
        ("vec.backend", "device"), ("train.device", str(device)), ("vec.num_envs", num_envs),
        ("train.total_steps", 10 ** 12), ("train.checkpoint_interval", 0),
        ("train.stop_return", 0.0), *overrides])


def make_trainer(impl: str, config):
    from peregrine.train.ppo import Trainer
    if impl == "peregrine":
        return Trainer(config)
    return Trainer(config, env=TrainerEnv(config.vec.num_envs, config.train.device,
                                          config.train.seed))


def measure_training(impl: str, num_envs: int, seconds: float, device, overrides=()) -> dict:
    """Training SPS: one warm-up update untimed, then updates for `seconds`, then a sync."""
    trainer = make_trainer(impl, train_config(num_envs, device, overrides))
    sync = synchroniser(trainer.device)
    try:
        started = time.perf_counter()
        trainer.update()
        sync()
        warmup = time.perf_counter() - started
        steps, updates, started = trainer.global_step, 0, time.perf_counter()
        while updates == 0 or time.perf_counter() - started < seconds:
            trainer.update()
            updates += 1
        sync()
        elapsed = time.perf_counter() - started
        return {"sps": (trainer.global_step - steps) / elapsed, "updates": updates,
                "seconds": elapsed, "warmup_seconds": warmup,
                "recent_return": trainer.recent_return()}
    finally:
        trainer.close()
        if not trainer.owns_env:
            trainer.env.close()


# ---- command line ---------------------------------------------------------------------

def parse_overrides(entries) -> list[tuple[str, str]]:
    """["train.minibatch_size=262144", ...] -> [("train.minibatch_size", "262144"), ...]."""
    pairs = []
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"--set entries are SECTION.KEY=VALUE, got {entry!r}")
        pairs.append((key, value))
    return pairs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[4096, 65536, 1 << 20])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--mode", default="both", choices=["env", "train", "both"])
    parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.KEY=VALUE",
                        help="training config overrides beside the fast config's "
                             "(e.g. train.minibatch_size=262144)")
    parser.add_argument("--json", help="also write the rows to this file (after every row)")
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.set)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: run with --device cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    device_name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (1 thread)"
    print(f"device: {device_name}")
    print(f"{'mode':<6} {'instances':>10} {'torch sps':>14} {'peregrine sps':>14} "
          f"{'peregrine/torch':>16}")
    modes = ["env", "train"] if args.mode == "both" else [args.mode]
    rows = []
    for mode in modes:
        for size in args.sizes:
            pair = {}
            for impl in ("torch", "peregrine"):
                if mode == "env":
                    measure = measure_torch_env if impl == "torch" else measure_peregrine_env
                    result = measure(size, args.seconds, device)
                else:
                    result = measure_training(impl, size, args.seconds, device, overrides)
                    result["overrides"] = [list(override) for override in overrides]
                row = {"mode": mode, "impl": impl, "instances": size, "device": device_name,
                       **result}
                rows.append(row)
                pair[impl] = row["sps"]
                if args.json:
                    write_json(args.json, rows)
            print(f"{mode:<6} {size:>10} {pair['torch']:>14,.0f} {pair['peregrine']:>14,.0f} "
                  f"{pair['peregrine'] / pair['torch']:>15.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
