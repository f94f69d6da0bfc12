"""check_env on a batch object that has only the required part of the native interface
(no statistics per instance, no state access, not a NativeEnv): the optional rules are
skipped, the required ones still hold and still catch a broken batch."""
from __future__ import annotations

import pytest

import peregrine
from peregrine.envs import EnvContractError, check_env
from peregrine.envs.check import _factory

REQUIRED = ("num_envs", "num_agents", "observation_space", "single_observation_space",
            "action_space", "single_action_space", "observations", "final_observations",
            "actions", "rewards", "terminals", "truncations", "masks", "stat_names",
            "reset", "step", "close")


class Minimal:
    """A third-party batch: the required attributes of a native batch, nothing else."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name in REQUIRED:
            return getattr(self._env, name)
        raise AttributeError(name)


def test_a_minimal_batch_is_checked_on_what_it_has():
    env = Minimal(peregrine.make("cartpole", num_envs=5, seed=0))
    assert not hasattr(env, "episode_stats") and not hasattr(env, "get_state")
    assert _factory(env) is None        # no twins can be made of it
    check_env(env)
    env.close()


def test_a_minimal_batch_still_fails_a_required_rule():
    class Replaying(Minimal):
        """Every instance plays instance 0's stream: a broken multi-instance batch."""

        def step(self, actions):
            result = self._env.step(actions)
            self._env.observations[1:] = self._env.observations[0]
            return result

    env = Replaying(peregrine.make("pendulum", num_envs=4, seed=0))
    with pytest.raises(EnvContractError, match="own random streams, not replay one"):
        check_env(env)
    env.close()
