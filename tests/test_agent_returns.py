"""A PettingZoo env's episodes report each agent's (or each kind's) return beside the
mean over its agents (emulation.agent_returns)."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import peregrine.vector as pv
from peregrine.evaluate import evaluate
from peregrine.vector.emulation import PER_AGENT_RETURNS, agent_returns


class Duel:
    """Two players, one step: the one who plays 1 against a 0 wins (+1, the other -1);
    equal plays draw. Zero-sum, so the mean return over the two is always 0."""

    metadata = {"name": "duel_v0"}
    possible_agents = ["first_0", "second_0"]

    def __init__(self):
        self.agents = []

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {agent: np.zeros(1, np.float32) for agent in self.agents}, {}

    def step(self, actions):
        first, second = int(actions["first_0"]), int(actions["second_0"])
        score = float(first - second)
        rewards = {"first_0": score, "second_0": -score}
        observations = {agent: np.ones(1, np.float32) for agent in self.agents}
        done = {agent: True for agent in self.agents}
        self.agents = []
        return observations, rewards, done, {a: False for a in done}, {a: {} for a in done}

    def close(self):
        pass


class Crowd(Duel):
    """Ten agents of two kinds (`red_N`, `blue_N`); red_4 never takes part. Each that
    plays gets its own index as reward: red mean (0+1+2+3)/4, blue mean (0+...+4)/5."""

    possible_agents = [f"red_{i}" for i in range(5)] + [f"blue_{i}" for i in range(5)]

    def reset(self, seed=None, options=None):
        self.agents = [agent for agent in self.possible_agents if agent != "red_4"]
        return {agent: np.zeros(1, np.float32) for agent in self.agents}, {}

    def step(self, actions):
        acting = self.agents
        rewards = {agent: float(agent.split("_")[1]) for agent in acting}
        self.agents = []
        return ({a: np.ones(1, np.float32) for a in acting}, rewards,
                {a: True for a in acting}, {a: False for a in acting}, {a: {} for a in acting})


def test_which_returns_an_env_reports():
    assert agent_returns(["first_0", "second_0"]) == {"return_first_0": [0],
                                                      "return_second_0": [1]}
    many = [f"piston_{i}" for i in range(PER_AGENT_RETURNS + 1)]
    assert agent_returns(many) == {}            # one kind: the mean is every agent's
    kinds = agent_returns(Crowd.possible_agents)
    assert kinds == {"return_red": [0, 1, 2, 3, 4], "return_blue": [5, 6, 7, 8, 9]}


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_a_zero_sum_game_reports_each_player(backend):
    env = pv.make(Duel, backend=backend, num_envs=2, num_workers=2 if backend != "serial"
                  else 1, seed=0)
    try:
        assert env.stat_names == ("episode_return", "episode_length", "return_first_0",
                                  "return_second_0")
        env.reset(seed=0)
        for first in (1, 1, 0):                 # first wins twice, then they draw
            env.step(np.array([first, 0] * 2, env.actions.dtype))
        stats = env.episode_stats()
        assert stats.count == 6
        assert stats.mean["episode_return"] == 0.0
        assert stats.mean["return_first_0"] == pytest.approx(2 / 3)
        assert stats.mean["return_second_0"] == pytest.approx(-2 / 3)
    finally:
        env.close()


def test_kinds_average_the_agents_that_took_part():
    env = pv.make(Crowd, backend="serial", num_envs=1, seed=0)
    try:
        env.reset(seed=0)
        env.step(np.zeros(env.num_agents, env.actions.dtype))
        stats = env.episode_stats()
        assert stats.mean["return_red"] == 1.5 and stats.mean["return_blue"] == 2.0
        assert stats.mean["episode_return"] == pytest.approx((6 + 10) / 9)
    finally:
        env.close()


def test_eval_scores_each_player():
    """A scripted policy where the first seat plays 1 and the second 0: eval says who
    wins, where the mean alone said 0."""
    result = evaluate(Duel, lambda observations: np.array([1, 0] * (len(observations) // 2)),
                      episodes=4)
    assert result["mean"]["episode_return"] == 0.0
    assert (result["mean"]["return_first_0"], result["mean"]["return_second_0"]) == (1.0, -1.0)
