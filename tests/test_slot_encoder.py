"""The slot encoder (`policy.slot_encoder = "deepsets"`, policy.py): DroneSwarm
describes its repeated observation slots, the policy's output does not depend on
their order (and does on everything else), and a run with it trains, checkpoints
and evaluates."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from peregrine.envs.drone_swarm import DroneSwarm
from peregrine.envs.drone_swarm.reference import DroneSwarmReference
from peregrine.train import checkpoint
from peregrine.train.config import load_config
from peregrine.train.policy import Policy
from peregrine.train.ppo import Trainer

WORLD = {"preset": "wilderness_obstacles", "obs_n_nearest": 3, "obs_report": 1}


def test_drone_swarm_describes_where_its_slots_are():
    env = DroneSwarm(num_envs=4, seed=1, **WORLD)
    (name, first, count, width), (name_o, first_o, count_o, width_o) = env.observation_slots
    assert (name, first, count, width) == ("detections", 10, 3, 3)
    assert (name_o, count_o, width_o) == ("obstacles", 2, 4)
    assert first_o == first + count * width and first_o + count_o * width_o == env.obs_dim - 1
    ref = DroneSwarmReference(num_envs=4, seed=1, **WORLD)    # the obstacle slots are there
    slots = ref._obstacle_slots(np.arange(4)).reshape(env.num_agents, -1)
    np.testing.assert_allclose(env.observations[:, first_o:first_o + 8], slots, atol=1e-6)
    assert DroneSwarm(num_envs=1, obs_n_nearest=0).observation_slots == ()
    env.close()


def permuted(observations, slots, rng):
    out = observations.clone()
    for _, first, count, width in slots:
        order = rng.permutation(count)
        block = observations[:, first:first + count * width].view(-1, count, width)
        out[:, first:first + count * width] = block[:, order].reshape(-1, count * width)
    return out


@pytest.mark.parametrize("lstm, critic", [(False, "local"), (True, "local"), (False, "global")])
def test_policy_output_does_not_depend_on_slot_order(lstm, critic):
    env = DroneSwarm(num_envs=8, seed=2, **WORLD)
    config = load_config("drone_swarm", overrides=[("policy.slot_encoder", "deepsets"),
                                                   ("policy.lstm", lstm)]).policy
    width = env.state_dim + env.agents_per_env if critic == "global" else 0
    config.critic = critic
    torch.manual_seed(0)
    policy = Policy(env.single_observation_space, env.single_action_space, config, width,
                    env.observation_slots)
    rng = np.random.default_rng(0)
    observations = torch.from_numpy(rng.uniform(-1, 1, (64, env.obs_dim)).astype(np.float32))
    observations[::3, 13:19] = 0.0                  # some empty detection slots
    critic_states = torch.rand(64, width) if width else None
    starts = torch.ones(64, dtype=torch.bool)
    state = policy.initial_state(64, "cpu")
    with torch.no_grad():
        params, values, _ = policy.heads(observations, state, starts, critic_states)
        for _ in range(3):
            shuffled = permuted(observations, env.observation_slots, rng)
            assert not torch.equal(shuffled, observations)
            params_p, values_p, _ = policy.heads(shuffled, state, starts, critic_states)
            torch.testing.assert_close(params_p, params, rtol=0, atol=1e-6)
            torch.testing.assert_close(values_p, values, rtol=0, atol=1e-5)
        moved = observations.clone()
        moved[:, [0, 1]] = moved[:, [1, 0]]         # an own feature, not a slot: it matters
        assert not torch.allclose(policy.heads(moved, state, starts, critic_states)[0], params)
    env.close()


def test_a_run_with_the_slot_encoder_trains_checkpoints_and_evaluates(tmp_path):
    from peregrine.evaluate import evaluate
    config = load_config("drone_swarm", overrides=[
        *(("env." + key, value) for key, value in WORLD.items()), ("env.max_steps", 20),
        ("vec.num_envs", 4), ("train.horizon", 16), ("train.minibatch_size", 160),
        ("train.total_steps", 3 * 4 * 10 * 16), ("policy.slot_encoder", "deepsets")])
    trainer = Trainer(config)
    first = trainer.policy.actor_body[0]
    assert [group[1:] for group in trainer.policy.observation_slots] == [[10, 3, 3], [19, 2, 4]]
    before = [p.detach().clone() for p in first.parameters()]
    for _ in range(3):
        trainer.update()
    assert any(not torch.equal(a, b) for a, b in zip(before, first.parameters()))
    path = tmp_path / "slots.pt"
    checkpoint.save(path, trainer.state_dict())
    trainer.close()
    result = evaluate("drone_swarm", str(path), episodes=2, seed=0)
    assert result["episodes"] == 2


def test_the_slot_encoder_is_refused_where_an_env_has_no_slots():
    with pytest.raises(ValueError, match="slot_encoder = 'deepsets' needs an env that describes"):
        Trainer(load_config("cartpole", overrides=[("policy.slot_encoder", "deepsets")]))
    with pytest.raises(ValueError, match="policy.slot_encoder = 'sets' is not one of"):
        load_config("cartpole", overrides=[("policy.slot_encoder", "sets")])
