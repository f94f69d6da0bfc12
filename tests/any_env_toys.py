"""Small Gymnasium and PettingZoo envs that the "train any env" tests name as factories
(`any_env_toys:function`): importable by Multiprocessing's spawned workers.

Each learning task is one step long (a contextual bandit), so a policy learns it in a
few thousand steps and the test can tell a policy that can solve it from one that
cannot:
* `parity_env`: the observation is Discrete(16); the rewarded action is the value's
  parity. One-hot encoding makes it linear; the raw integer through a small tanh MLP
  is a sawtooth that it does not fit in the same budget.
* `image_env`: an 8x8 uint8 image with a bright 2x2 square in the left or right half;
  the rewarded action is that side.
* `dict_env`: a Dict of a Discrete cue, a noise Box and an action mask; the rewarded
  action is the cue, among the actions the mask allows.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _OneStep(gym.Env):
    """A one-step episode: reward 1 for the right action, then it ends."""

    def __init__(self):
        self.target = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = 1.0 if int(action) == self.target else 0.0
        return self._observe(), reward, True, False, {}


class ParityEnv(_OneStep):
    observation_space = spaces.Discrete(16)
    action_space = spaces.Discrete(2)

    def _observe(self):
        value = int(self.np_random.integers(16))
        self.target = value % 2
        return value


class ImageEnv(_OneStep):
    observation_space = spaces.Box(0, 255, (8, 8, 1), np.uint8)
    action_space = spaces.Discrete(2)

    def _observe(self):
        image = np.zeros((8, 8, 1), np.uint8)
        self.target = int(self.np_random.integers(2))
        row = int(self.np_random.integers(7))
        column = int(self.np_random.integers(3)) + 4 * self.target
        image[row:row + 2, column:column + 2] = 255
        return image


class DictEnv(_OneStep):
    observation_space = spaces.Dict({
        "cue": spaces.Discrete(4),
        "noise": spaces.Box(-1.0, 1.0, (3,), np.float32),
        "action_mask": spaces.MultiBinary(4)})
    action_space = spaces.Discrete(4)

    def _observe(self):
        self.target = int(self.np_random.integers(4))
        mask = np.zeros(4, np.int8)
        mask[self.target] = 1
        mask[int(self.np_random.integers(4))] = 1      # one or two allowed actions
        self.mask = mask
        return {"cue": self.target, "action_mask": mask,
                "noise": self.np_random.uniform(-1, 1, 3).astype(np.float32)}

    def step(self, action):
        if not self.mask[int(action)]:
            raise AssertionError(f"action {action} is masked out ({self.mask})")
        return super().step(action)


class InfoMaskEnv(_OneStep):
    """DictEnv's task with a Box cue and the valid actions in `info["action_mask"]`."""

    observation_space = spaces.Box(0.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        gym.Env.reset(self, seed=seed)
        return self._observe(), {"action_mask": self.mask}

    def _observe(self):
        self.target = int(self.np_random.integers(4))
        self.mask = np.zeros(4, np.int8)
        self.mask[self.target] = 1
        self.mask[int(self.np_random.integers(4))] = 1
        return np.eye(4, dtype=np.float32)[self.target]

    def step(self, action):
        if not self.mask[int(action)]:
            raise AssertionError(f"action {action} is masked out ({self.mask})")
        reward = 1.0 if int(action) == self.target else 0.0
        return self._observe(), reward, True, False, {"action_mask": self.mask}


def info_mask_env():
    return InfoMaskEnv()


class SampleEnv(gym.Env):
    """Observations are samples of any given space, drawn from a stream seeded by
    reset(seed): the tests redraw them to check what the buffers hold."""

    action_space = spaces.Discrete(2)

    def __init__(self, observation_space):
        self.observation_space = observation_space

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def parity_env():
    return ParityEnv()


def image_env():
    return ImageEnv()


def dict_env():
    return DictEnv()


def chain_env(length: int = 5):
    """A corridor: reward 1 at the right end; kwargs come from [env] (tests pass length)."""
    return gym.wrappers.TimeLimit(_Chain(length), max_episode_steps=4 * length)


COUNTED_CHAINS = []


def counted_chain_env(length: int = 5):
    """chain_env that records each call (in this process) in COUNTED_CHAINS."""
    COUNTED_CHAINS.append(length)
    return chain_env(length)


class _Chain(gym.Env):
    observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, length):
        self.length = int(length)
        self.position = 0

    def _observe(self):
        return np.array([self.position / self.length], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return self._observe(), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if int(action) == 1 else -1))
        done = self.position >= self.length
        return self._observe(), float(done), done, False, {}


def needs_a_missing_package():
    import peregrine_missing_simulator  # noqa: F401  (the missing package under test)
    raise AssertionError("unreachable")


class TagParallelEnv:
    """A PettingZoo ParallelEnv where agents leave and join: three agents on a line;
    agent i leaves the episode once it reached the end (terminated), and agent_2 joins
    only from the second step. Rewards: 1 to an agent for reaching the end."""

    metadata = {"name": "tag_v0"}

    def __init__(self, length: int = 3):
        self.possible_agents = ["agent_0", "agent_1", "agent_2"]
        self.length = length
        self.agents = []
        self._space = spaces.Box(0.0, 1.0, (2,), np.float32)
        self._actions = spaces.Discrete(2)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return self._actions

    def _obs(self, agent):
        return np.array([self.position[agent] / self.length, self.steps / 10.0], np.float32)

    def reset(self, seed=None, options=None):
        self.agents = ["agent_0", "agent_1"]
        self.position = {agent: 0 for agent in self.possible_agents}
        self.steps = 0
        return {agent: self._obs(agent) for agent in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.steps += 1
        rewards, terminations, truncations = {}, {}, {}
        for agent in self.agents:
            self.position[agent] += 1 if int(actions[agent]) == 1 else 0
            done = self.position[agent] >= self.length
            rewards[agent] = float(done)
            terminations[agent] = done
            truncations[agent] = self.steps >= 10 and not done
        observations = {agent: self._obs(agent) for agent in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        if self.steps == 1 and self.agents:
            self.agents.append("agent_2")
            observations["agent_2"] = self._obs("agent_2")
        infos = {agent: {} for agent in observations}
        return observations, rewards, terminations, truncations, infos

    def close(self):
        pass


def tag_parallel_env(length: int = 3):
    return TagParallelEnv(length)


def cartpole_vector_env(num_envs: int = 4):
    """A factory returning a VectorEnv: four same-step CartPoles in one unit."""
    from gymnasium.vector import AutoresetMode
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})


def cartpole_native_batch(num_envs: int = 4):
    """A factory returning a native batch of four CartPoles (a copied unit)."""
    from peregrine.envs.registry import env_class
    return env_class("cartpole")(num_envs=num_envs, seed=0)
