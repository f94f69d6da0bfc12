"""The benchmark suite (pytest-benchmark). Not part of the test suite.

    .venv/bin/python -m pytest benchmarks/test_bench_suite.py --benchmark-only \
        --benchmark-min-time=0.05 --benchmark-max-time=0.5 --benchmark-columns=min,median,mean,rounds

Categories: vecenv_step (one C call stepping a whole native batch),
space_flatten (a Dict observation into a flat row: Gymnasium's
`spaces.flatten` vs Peregrine's `FlatObservation.write`), gae_compute (the
trainer's vectorized GAE over [T, N]), policy_forward (a small torch MLP on
[N, obs]), buffer_add (one rollout step written into preallocated torch
storage), env_step_cost (per-env-step nanoseconds of every registered env),
and metrics_write (`MetricsWriter.update`, against one PPO update). Each test
stores a throughput in `extra_info` (see --benchmark-json). Sizes are small
so the whole suite takes well under a minute on 2 shared cores.
"""
from __future__ import annotations

import math
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import peregrine  # noqa: E402
from peregrine.profile.bench import action_pool  # noqa: E402

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

ROWS = 4096
HORIZON = 64


def _make_or_skip(name, num_envs, num_threads=1):
    try:
        return peregrine.make(name, num_envs=num_envs, seed=0, num_threads=num_threads)
    except ImportError as error:  # env registered but its C module not built here
        pytest.skip(f"{name} not built: {error}")


# ---- vecenv_step ----------------------------------------------------------------
@pytest.mark.parametrize("num_threads", [1, 2])
def test_vecenv_step(benchmark, num_threads):
    env = _make_or_skip("cartpole", ROWS, num_threads)
    env.reset(seed=0)
    actions = action_pool(env, 1)[0]
    benchmark.group = "vecenv_step"
    benchmark(env.step, actions)
    benchmark.extra_info["agent_steps_per_sec"] = env.num_agents / benchmark.stats.stats.median
    env.close()


# ---- env_step_cost: every registered env --------------------------------------------
@pytest.mark.parametrize("name", peregrine.list_envs())
def test_env_step_cost(benchmark, name):
    env = _make_or_skip(name, 1024)
    env.reset(seed=0)
    pool = action_pool(env, 8)
    state = {"i": 0}

    def step():
        state["i"] = (state["i"] + 1) % len(pool)
        env.step(pool[state["i"]])

    benchmark.group = "env_step_cost"
    benchmark(step)
    benchmark.extra_info["ns_per_agent_step"] = benchmark.stats.stats.median / env.num_agents * 1e9
    benchmark.extra_info["agent_steps_per_sec"] = env.num_agents / benchmark.stats.stats.median
    env.close()


# ---- space_flatten ----------------------------------------------------------------
def _dict_space():
    from gymnasium import spaces
    space = spaces.Dict({
        "position": spaces.Box(-10, 10, (3,), np.float32),
        "velocity": spaces.Box(-5, 5, (3,), np.float32),
        "grid": spaces.Box(0, 1, (8, 8), np.float32),
        "mode": spaces.Discrete(4),
    })
    space.seed(0)
    return space, space.sample()


def test_space_flatten_gymnasium(benchmark):
    from gymnasium import spaces
    space, observation = _dict_space()
    benchmark.group = "space_flatten"
    flat = benchmark(spaces.flatten, space, observation)
    assert flat.shape == (3 + 3 + 64 + 4,)   # Discrete is one-hot here
    benchmark.extra_info["observations_per_sec"] = 1 / benchmark.stats.stats.median


def test_space_flatten_peregrine(benchmark):
    flat_module = pytest.importorskip("peregrine.vector.spaces")
    space, observation = _dict_space()
    flattener = flat_module.FlatObservation(space)
    row = np.zeros(flattener.size, np.float32)
    benchmark.group = "space_flatten"
    benchmark(flattener.write, observation, row)
    assert flattener.size == 3 + 3 + 64 + 1   # Discrete as its integer value
    benchmark.extra_info["observations_per_sec"] = 1 / benchmark.stats.stats.median


# ---- gae_compute --------------------------------------------------------------------
def _gae_function():
    try:
        from peregrine.train.ppo import compute_gae
        return compute_gae
    except ImportError:
        def compute_gae(rewards, values, dones, last_value, gamma, lam, out=None):
            not_done = 1.0 - dones.float()
            next_values = torch.cat([values[1:], last_value.unsqueeze(0)], 0)
            deltas = rewards + gamma * next_values * not_done - values
            advantages = torch.empty_like(rewards) if out is None else out
            advantages[-1] = deltas[-1]
            for t in range(rewards.shape[0] - 2, -1, -1):
                advantages[t] = deltas[t] + gamma * lam * not_done[t] * advantages[t + 1]
            return advantages
        return compute_gae


def test_gae_compute(benchmark):
    compute_gae = _gae_function()
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(HORIZON, ROWS, generator=generator)
    values = torch.rand(HORIZON, ROWS, generator=generator)
    dones = torch.rand(HORIZON, ROWS, generator=generator) < 0.02
    last_value = torch.rand(ROWS, generator=generator)
    out = torch.empty(HORIZON, ROWS)
    benchmark.group = "gae_compute"
    benchmark(compute_gae, rewards, values, dones, last_value, 0.99, 0.95, out=out)
    assert torch.isfinite(out).all()
    benchmark.extra_info["samples_per_sec"] = HORIZON * ROWS / benchmark.stats.stats.median


# ---- policy_forward -----------------------------------------------------------------
@pytest.mark.parametrize("obs_dim", [4, 64])
def test_policy_forward(benchmark, obs_dim):
    torch.manual_seed(0)
    policy = torch.nn.Sequential(
        torch.nn.Linear(obs_dim, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 3))  # 2 logits + 1 value
    observations = torch.randn(ROWS, obs_dim)

    def forward():
        with torch.no_grad():
            return policy(observations)

    benchmark.group = "policy_forward"
    benchmark(forward)
    benchmark.extra_info["rows_per_sec"] = ROWS / benchmark.stats.stats.median


# ---- buffer_add -----------------------------------------------------------------------
def test_buffer_add(benchmark):
    obs_dim = 4
    storage = {
        "observations": torch.zeros(HORIZON, ROWS, obs_dim),
        "actions": torch.zeros(HORIZON, ROWS, dtype=torch.int64),
        "logprobs": torch.zeros(HORIZON, ROWS),
        "values": torch.zeros(HORIZON, ROWS),
        "rewards": torch.zeros(HORIZON, ROWS),
        "dones": torch.zeros(HORIZON, ROWS, dtype=torch.bool),
    }
    # The env's NumPy buffers, seen by torch without a copy (as the trainer does).
    env_obs = torch.from_numpy(np.random.default_rng(0).standard_normal((ROWS, obs_dim), np.float32))
    env_rewards = torch.from_numpy(np.ones(ROWS, np.float32))
    env_terminals = torch.from_numpy(np.zeros(ROWS, np.bool_))
    env_truncations = torch.from_numpy(np.zeros(ROWS, np.bool_))
    actions = torch.zeros(ROWS, dtype=torch.int64)
    logprobs = torch.zeros(ROWS)
    values = torch.zeros(ROWS)
    step = {"t": 0}

    def add():
        t = step["t"] = (step["t"] + 1) % HORIZON
        storage["observations"][t].copy_(env_obs)
        storage["actions"][t] = actions
        storage["logprobs"][t] = logprobs
        storage["values"][t] = values
        storage["rewards"][t].copy_(env_rewards)
        torch.logical_or(env_terminals, env_truncations, out=storage["dones"][t])

    benchmark.group = "buffer_add"
    benchmark(add)
    benchmark.extra_info["rows_per_sec"] = ROWS / benchmark.stats.stats.median


# ---- metrics_write: the dashboard's cost to the trainer ------------------------------
def test_metrics_write(benchmark, tmp_path):
    from peregrine.monitor.metrics import MetricsWriter
    writer = MetricsWriter(tmp_path / "run", ["episode_return", "episode_length", "score"])
    record = dict(global_step=123456, updates=12, sps=98765.4, elapsed=12.5, episodes=321,
                  episode_return=187.5, episode_length=187.5,
                  env_stats={"episode_return": 187.5, "episode_length": 187.5, "score": 1.0},
                  losses={"policy_loss": -0.01, "value_loss": 3.2, "entropy": 0.6, "approx_kl": 0.01,
                          "clip_fraction": 0.1, "learning_rate": 3e-4},
                  time_split={"env": 0.01, "forward": 0.02, "learn": 0.05})
    benchmark.group = "metrics_write"
    benchmark(lambda: writer.update(**record))
    writer.close()
    benchmark.extra_info["writes_per_sec"] = 1 / benchmark.stats.stats.median


def test_ppo_update_cartpole(benchmark):
    """One PPO update with the shipped CartPole config: the denominator of
    metrics_write's share of training time (one write per update)."""
    ppo = pytest.importorskip("peregrine.train.ppo")
    from peregrine.train import load_config
    config = load_config("cartpole", overrides=[("train.total_steps", 10 ** 12)])
    trainer = ppo.Trainer(config)
    trainer.update()  # warm-up
    benchmark.group = "metrics_write"
    benchmark.pedantic(trainer.update, rounds=10, iterations=1)
    benchmark.extra_info["steps_per_update"] = trainer.batch_size
    benchmark.extra_info["sps"] = trainer.batch_size / benchmark.stats.stats.median
    trainer.close()
    assert math.isfinite(benchmark.stats.stats.median)
