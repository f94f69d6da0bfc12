"""The declared batch interface (envs/native/protocols.py): which batches satisfy
which protocol is what the trainer relies on (exact resume, global states, bulk
state transfers, structured rows), so each answer is checked here on the real
classes."""
from __future__ import annotations

import numpy as np
import pytest

import peregrine
import peregrine.vector as pv
from peregrine.envs.native import protocols as P


def test_a_native_batch_offers_exact_state_and_a_multi_agent_one_its_global_state():
    with peregrine.make("cartpole", num_envs=2, seed=1) as env:
        assert isinstance(env, P.Batch) and isinstance(env, P.ExactState)
        assert isinstance(env, P.NamedStats) and isinstance(env, P.AgentMasks)
        assert isinstance(env, P.InstanceReset) and not isinstance(env, P.BulkState)
    with peregrine.make("drone_swarm", num_envs=1, seed=1) as env:
        assert isinstance(env, P.GlobalState) and env.state_dim > 0
        assert isinstance(env, P.ObservationSlots) and env.observation_slots


def test_the_device_batch_moves_states_in_bulk():
    with peregrine.make("cartpole", num_envs=2, seed=1, device="cpu") as env:
        assert isinstance(env, P.Batch) and isinstance(env, P.BulkState)
        assert isinstance(env, P.ExactState)


def test_a_vector_backend_offers_exact_state_only_over_native_envs():
    with pv.make("cartpole", backend="serial", num_envs=2, num_workers=2) as native:
        assert isinstance(native, P.Batch) and isinstance(native, P.ExactState)
    with pv.make("gym:CartPole-v1", backend="serial", num_envs=2) as emulated:
        assert isinstance(emulated, P.Batch) and not isinstance(emulated, P.ExactState)
        assert isinstance(emulated, P.StructuredRows)


def test_a_batch_of_your_own_needs_only_the_batch_members():
    """The trainer's minimum: without masks or stat names the rows are all live and
    the statistics are the default two."""
    from gymnasium import spaces

    class Mine:
        num_envs = num_agents = 2
        agents_per_env = 1
        single_observation_space = spaces.Box(-1, 1, (3,), np.float32)
        single_action_space = spaces.Discrete(2)
        observations = final_observations = np.zeros((2, 3), np.float32)
        actions = np.zeros(2, np.int32)
        rewards = np.zeros(2, np.float32)
        terminals = truncations = np.zeros(2, np.uint8)

        def reset(self, seed=None):
            return self.observations, {}

        def step(self, actions):
            return self.observations, self.rewards, self.terminals, self.truncations, {}

        def episode_stats(self, clear=True):
            return None

        def close(self):
            pass

    mine = Mine()
    assert isinstance(mine, P.Batch)
    assert not any(isinstance(mine, capability) for capability in (
        P.ExactState, P.BulkState, P.GlobalState, P.AgentMasks, P.NamedStats))
    del Mine.step
    assert not isinstance(Mine(), P.Batch)


@pytest.mark.parametrize("name", ["cartpole", "prospector"])
def test_action_mask_columns_are_declared_by_the_env_class(name):
    from peregrine.envs.registry import env_class
    assert isinstance(env_class(name), P.ActionMaskColumns) == (name == "prospector")


def test_layout_constants_come_from_the_header():
    """DroneSwarm's Python layout is the C header's (ENV_CONSTANTS -> constants()):
    the flat state's size that Python computes is the one the C env reports, for
    worlds with and without obstacles; an env without constants has none."""
    from peregrine.envs.cartpole import _cartpole
    from peregrine.envs.drone_swarm import _drone_swarm, state_layout
    assert _cartpole.constants() == {}
    assert _drone_swarm.constants()["header_size"] > 0
    for config in ({}, {"n_obstacles": 3, "n_drones": 5, "n_victims": 4}):
        with peregrine.make("drone_swarm", num_envs=1, seed=1, **config) as env:
            assert len(env.get_state(0)) == state_layout(env.config)["size"]
