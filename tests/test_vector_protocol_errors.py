"""The vector backends' calling protocol: recv/send out of order is named, actions
written in place into the env's own buffer are taken as they are (no copy, same
results), and what is not an env or not an array is refused by name."""
from __future__ import annotations

import numpy as np
import pytest

import peregrine.vector as pv


def test_recv_out_of_order_is_named():
    with pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2,
                 batch_size=2, seed=0, overwork=True) as env:
        with pytest.raises(RuntimeError, match=r"recv\(\) has nothing to wait for: call "
                                               r"async_reset\(\) first"):
            env.recv()
        env.async_reset(seed=0)
        env.recv()
        with pytest.raises(RuntimeError, match=r"recv\(\) was called twice without send\(\)"):
            env.recv()


def test_actions_written_in_place_are_sent_as_they_are():
    """send() of the batch's own rows of env.actions acts as send() of a copy: every
    env plays the same episode (which workers come back first varies from run to run,
    so each env's own sequence is compared)."""
    runs = []
    for in_place in (False, True):
        per_env = {env_id: [] for env_id in range(4)}
        with pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2,
                     batch_size=2, seed=3, overwork=True) as env:
            env.async_reset(seed=3)
            for _ in range(5000):       # until every env has 10 steps (workers are not fair)
                if min(len(steps) for steps in per_env.values()) >= 10:
                    break
                observations, rewards, *_rest, env_ids, _masks = env.recv()
                for row, env_id in enumerate(env_ids):
                    per_env[int(env_id)].append((observations[row].copy(), float(rewards[row])))
                chosen = (observations[:, 2] > 0).astype(np.int32)   # a rule of the observation
                assert env_ids[1] == env_ids[0] + 1                   # one worker's block
                if in_place:
                    target = env.actions[env_ids[0]:env_ids[0] + 2]
                    target[...] = chosen
                    env.send(target)
                else:
                    env.send(chosen)
        runs.append(per_env)
    for env_id in range(4):
        plain, in_place = runs[0][env_id], runs[1][env_id]
        assert min(len(plain), len(in_place)) >= 10
        for (obs_a, rew_a), (obs_b, rew_b) in zip(plain, in_place):
            np.testing.assert_array_equal(obs_a, obs_b)
            assert rew_a == rew_b


def test_actions_written_in_place_skip_the_check_and_the_copy():
    """A view of the shared action rows is a new object on every slice: send() knows
    it by its memory, not by identity, and neither checks nor copies it; any other
    array is checked and copied."""
    with pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2,
                 batch_size=2, seed=0, overwork=True) as env:
        checked = []
        env._check_actions = lambda actions, rows: checked.append(rows)
        env.async_reset(seed=0)
        *_rest, env_ids, _masks = env.recv()
        env.send(env.actions[env_ids[0]:env_ids[0] + 2])
        assert checked == []
        *_rest, env_ids, _masks = env.recv()
        env.send(np.zeros(2, dtype=env.actions.dtype))
        assert checked == [2]


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_step_with_the_envs_own_action_buffer(backend):
    results = []
    for in_place in (False, True):
        with pv.make("cartpole", backend=backend, num_envs=4, num_workers=2, seed=5,
                     overwork=True) as env:
            env.reset(seed=5)
            trace = []
            for step in range(20):
                chosen = np.full(4, step % 2, np.int32)
                if in_place:
                    env.actions[...] = chosen
                    outputs = env.step(env.actions)
                else:
                    outputs = env.step(chosen)
                trace.append([array.copy() for array in outputs[:4]])
            results.append(trace)
    for a, b in zip(*results):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_actions_that_are_not_an_array_and_envs_that_are_not_envs_are_named():
    with pv.make("cartpole", backend="serial", num_envs=4, num_workers=2, seed=0) as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match=r"actions must be a NumPy array of dtype int32 and "
                                             r"shape \(4,\), got list"):
            env.step([0, 1, 0, 1])
        assert repr(env) == "Serial('cartpole', num_envs=4, num_workers=2, batch_size=4)"
    with pytest.raises(ValueError, match=r"env must be a registered env name \(str\) or a "
                                         r"zero-arg callable creating an env, got int"):
        pv.make(42, backend="serial", num_envs=2)
