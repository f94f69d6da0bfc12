"""Small envs and helpers shared by the tests/test_vector*.py files."""
from __future__ import annotations

import os

import gymnasium
import numpy as np
from gymnasium import spaces


def gym_cartpole(max_episode_steps=None):
    if max_episode_steps is None:
        return gymnasium.make("CartPole-v1")
    return gymnasium.make("CartPole-v1", max_episode_steps=max_episode_steps)


class NestedEnv(gymnasium.Env):
    """Dict/Tuple observations and a nested discrete action; deterministic.

    State: a counter t. Observation: {"pos": Box(2,3) filled with t + seed
    offset, "flags": MultiBinary(2), "inner": (Discrete(5, start=2), Box(1))}.
    Reward = sum of the action leaves; terminates when t reaches `length`.
    """

    def __init__(self, length=3):
        self.length = length
        self.observation_space = spaces.Dict({
            "pos": spaces.Box(-10, 10, (2, 3), np.float32),
            "flags": spaces.MultiBinary(2),
            "inner": spaces.Tuple((spaces.Discrete(5, start=2), spaces.Box(0, 1, (1,)))),
        })
        self.action_space = spaces.Tuple((spaces.Discrete(3, start=1),
                                          spaces.MultiDiscrete([2, 4])))
        self.offset = 0.0
        self.t = 0
        self.last_action = None

    def _obs(self):
        return {"pos": np.full((2, 3), self.t + self.offset, np.float32),
                "flags": np.array([self.t % 2, 1], np.int8),
                "inner": (2 + self.t % 5, np.array([0.5], np.float32))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.offset = float(seed % 7)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.last_action = action
        self.t += 1
        reward = float(action[0] + int(np.sum(action[1])))
        return self._obs(), reward, self.t >= self.length, False, {}


try:  # a real ParallelEnv when PettingZoo is installed; duck-typed otherwise
    from pettingzoo import ParallelEnv as _ParallelBase
except ImportError:  # pragma: no cover
    _ParallelBase = object


class Squad(_ParallelBase):
    """A PettingZoo ParallelEnv with agents that leave at different times.

    Agent i (of 3) terminates after i + 2 steps; the episode truncates after
    `limit` steps for whoever is left. Observation per agent: Box(3) = [agent
    index, step, last action]; actions Discrete(4); reward = action.
    """

    metadata = {"name": "squad_v0"}

    def __init__(self, limit=10):
        self.possible_agents = ["a0", "a1", "a2"]
        self.agents = []
        self.limit = limit
        self._obs_space = spaces.Box(-100, 100, (3,), np.float32)
        self._act_space = spaces.Discrete(4)
        self.t = 0

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def _obs(self, agent, action=0):
        return np.array([self.possible_agents.index(agent), self.t, action], np.float32)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        observations = {a: self._obs(a, int(actions[a])) for a in self.agents}
        rewards = {a: float(actions[a]) for a in self.agents}
        terminations = {a: self.t >= self.possible_agents.index(a) + 2 for a in self.agents}
        truncations = {a: self.t >= self.limit for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, {a: {} for a in observations}

    def close(self):
        pass


def shm_segments():
    return {name for name in os.listdir("/dev/shm") if name.startswith(("psm_", "wnsm_"))}


def record_segments(monkeypatch):
    """The names of the shared-memory segments this process creates from now on (a
    set that fills as they are made): a leak check that other jobs on a shared
    machine, making and freeing segments of their own, cannot disturb."""
    from multiprocessing import shared_memory
    names = set()
    original = shared_memory.SharedMemory

    class Recording(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if kwargs.get("create"):
                names.add(self.name.lstrip("/"))

    monkeypatch.setattr(shared_memory, "SharedMemory", Recording)
    return names


def child_pids(pid=None):
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except FileNotFoundError:
        return []


def random_actions(env, steps, seed=0):
    rng = np.random.default_rng(seed)
    space = env.single_action_space
    high = space.n if isinstance(space, spaces.Discrete) else space.nvec
    return rng.integers(0, high, (steps, *env.actions.shape)).astype(env.actions.dtype)


class FlakyEnv(gymnasium.Env):
    """CartPole-shaped env whose step raises after `fail_at` steps."""

    def __init__(self, fail_at=3):
        self.observation_space = spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.fail_at = fail_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t >= self.fail_at:
            raise RuntimeError("flaky env exploded")
        return np.zeros(4, np.float32), 0.0, False, False, {}


def fails_in_worker():
    """An env creator that works in the parent (the probe) but not in a worker."""
    import multiprocessing
    if multiprocessing.parent_process() is not None:
        raise OSError("no display in the worker")
    return gym_cartpole()


def pid_alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def slow_in_worker_1():
    """CartPole that takes 30 ms per step in the worker named peregrine-worker-1."""
    import multiprocessing
    import time

    env = gym_cartpole()
    if multiprocessing.current_process().name.endswith("-1"):
        step = env.step

        def slow_step(action):
            time.sleep(0.03)
            return step(action)
        env.step = slow_step
    return env


def slow_cartpole():
    """CartPole taking 0.2 s per step and reset: time to interrupt the parent."""
    import time

    env = gym_cartpole()
    step, reset = env.step, env.reset

    def slow_step(action):
        time.sleep(0.2)
        return step(action)

    def slow_reset(**kwargs):
        time.sleep(0.2)
        return reset(**kwargs)
    env.step, env.reset = slow_step, slow_reset
    return env
