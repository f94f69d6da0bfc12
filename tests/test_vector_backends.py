"""Serial, Multiprocessing and native backends: one interface, identical results."""
from __future__ import annotations

import numpy as np
import pytest

import peregrine.vector as pv
from peregrine.envs.native.batch import EpisodeStats

from test_vector_helpers import (Squad, gym_cartpole, random_actions, record_segments,
                                 shm_segments, slow_in_worker_1)

BUFFERS = ("observations", "rewards", "terminals", "truncations", "masks")


def _run(env, actions, seed):
    """Every buffer after every step, plus final observations of ended rows."""
    observations, _ = env.reset(seed=seed)
    trace = [observations.copy()]
    for step_actions in actions:
        outputs = env.step(step_actions)
        trace.extend(array.copy() for array in outputs[:4])
        ended = env.terminals | env.truncations
        trace.append(env.final_observations[ended].copy())
        trace.append(env.masks.copy())
    return trace, env.episode_stats()


def _assert_same(trace_a, trace_b):
    assert len(trace_a) == len(trace_b)
    for a, b in zip(trace_a, trace_b):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("env_spec", ["cartpole", "gym", "squad"])
def test_serial_and_multiprocessing_agree_exactly(env_spec):
    env, num_envs = {"cartpole": ("cartpole", 8), "gym": (gym_cartpole, 4),
                     "squad": (lambda: Squad(limit=6), 2)}[env_spec]
    serial = pv.make(env, backend="serial", num_envs=num_envs, num_workers=2, seed=11)
    with serial:
        actions = random_actions(serial, 120, seed=3)
        serial_trace, serial_stats = _run(serial, actions, seed=11)
    with pv.make(env, backend="multiprocessing", num_envs=num_envs, num_workers=2,
                 seed=11, overwork=True) as multi:
        assert multi.single_observation_space == serial.single_observation_space
        assert multi.single_action_space == serial.single_action_space
        assert (multi.num_agents, multi.agents_per_env) == (serial.num_agents,
                                                            serial.agents_per_env)
        multi_trace, multi_stats = _run(multi, actions, seed=11)
    _assert_same(serial_trace, multi_trace)
    assert isinstance(multi_stats, EpisodeStats) and multi_stats.count > 0
    assert multi_stats == serial_stats


def test_one_block_reproduces_the_plain_native_env():
    actions = np.random.default_rng(0).integers(0, 2, (50, 16)).astype(np.int32)
    traces = []
    for backend in ("native", "serial"):
        with pv.make("cartpole", backend=backend, num_envs=16, seed=4) as env:
            traces.append(_run(env, actions, seed=4)[0])
    _assert_same(*traces)


def test_multiprocessing_writes_native_batches_straight_into_shared_memory():
    with pv.make("cartpole", backend="multiprocessing", num_envs=64, num_workers=2,
                 num_threads=2, seed=0, overwork=True) as env:
        observations, _ = env.reset(seed=0)
        segment = env._resources.shm
        # the returned buffers ARE views of the one shared segment (zero-copy)
        for name in BUFFERS + ("final_observations", "actions"):
            array = getattr(env, name)
            assert np.shares_memory(array, np.frombuffer(segment.buf, np.uint8))
        before = observations.copy()
        outputs = env.step(np.ones(64, np.int32))
        assert outputs[0] is observations
        assert not np.array_equal(before, observations)
        # the worker's batch ran with 2 threads inside (hierarchical) and still
        # matches the single-threaded Serial result
        with pv.make("cartpole", backend="serial", num_envs=64, num_workers=2, seed=0) as ref:
            ref.reset(seed=0)
            ref.step(np.ones(64, np.int32))
            np.testing.assert_array_equal(ref.observations, observations)


def test_async_batches_return_first_ready_workers_with_env_ids():
    with pv.make("cartpole", backend="multiprocessing", num_envs=8, num_workers=4,
                 batch_size=4, seed=2, overwork=True) as env:
        assert env.envs_per_worker == 2 and env.workers_per_batch == 2
        with pytest.raises(ValueError, match="use send\\(\\) and recv\\(\\)"):
            env.step(np.zeros(8, np.int32))
        env.async_reset(seed=2)
        seen = []
        steps_per_env = np.zeros(8, int)
        for _ in range(40):
            observations, rewards, terminals, truncations, infos, env_ids, masks = env.recv()
            assert observations.shape == (4, 4) and env_ids.shape == (4,)
            assert len(set(env_ids.tolist())) == 4
            # rows are those envs' rows of the shared buffers
            np.testing.assert_array_equal(observations, env.observations[env_ids])
            np.testing.assert_array_equal(rewards, env.rewards[env_ids])
            seen.append(sorted(env_ids.tolist()))
            steps_per_env[env_ids] += 1
            env.send(np.ones(4, np.int32))
        # every env got stepped: surplus envs are picked up as they finish
        assert (steps_per_env > 0).all()
        assert env.episode_stats().count >= 0
        with pytest.raises(RuntimeError, match="send\\(\\) must follow recv\\(\\)"):
            env.send(np.ones(4, np.int32))


def test_async_contiguous_batches_are_views():
    with pv.make("cartpole", backend="multiprocessing", num_envs=4, num_workers=2,
                 batch_size=2, seed=0, overwork=True) as env:
        env.async_reset(seed=0)
        for _ in range(10):
            observations, *_rest, env_ids, masks = env.recv()
            assert observations.base is not None
            assert np.shares_memory(observations, env.observations)  # one worker: contiguous
            env.send(np.zeros(2, np.int32))


def test_async_recv_returns_the_first_workers_ready_gathered_when_apart():
    with pv.make(slow_in_worker_1, backend="multiprocessing", num_envs=3, num_workers=3,
                 batch_size=2, seed=0, overwork=True) as env:
        env.async_reset(seed=0)
        observations, rewards, *_rest, env_ids, masks = env.recv()
        assert env_ids.tolist() == [0, 1]
        assert np.shares_memory(observations, env.observations)  # contiguous: a view
        env.send(np.zeros(2, np.int64))
        # env 2 was waiting; env 0 finishes long before the slow env 1
        observations, rewards, *_rest, env_ids, masks = env.recv()
        assert env_ids.tolist() == [0, 2]
        assert not np.shares_memory(observations, env.observations)  # gathered copy
        np.testing.assert_array_equal(observations, env.observations[[0, 2]])
        assert rewards.tolist() == [1.0, 0.0]  # env 2 comes straight from its reset
        assert masks.all()


def test_async_results_match_serial_per_env():
    """Each env ends up where Serial puts it after the same number of steps,
    whatever order the workers finished in."""
    with pv.make("cartpole", backend="multiprocessing", num_envs=6, num_workers=3,
                 batch_size=2, seed=9, overwork=True) as env:
        env.async_reset(seed=9)
        sends = np.zeros(3, int)  # per worker (block of 2 envs)
        while sends.min() < 5:
            *_outputs, env_ids, _masks = env.recv()
            env.send(np.zeros(2, np.int32))
            sends[env_ids[0] // 2] += 1
        env._settle()
        state = env.observations.copy()
    with pv.make("cartpole", backend="serial", num_envs=6, num_workers=3, seed=9) as ref:
        ref.reset(seed=9)
        for block, count in zip(ref.blocks, sends):
            for _ in range(count):
                block.units[0].step(np.zeros(2, np.int32))
        np.testing.assert_array_equal(ref.observations, state)


def test_worker_groups_step_on_their_own_and_agree_with_step():
    """Groups of workers started and waited for separately, overlapping and in either
    order, leave every env where step() puts it; each group's buffers are views of
    its rows, and its actions are checked as step()'s are."""
    actions = [np.array([t % 2, 1, 0, (t + 1) % 2, 1, 1], np.int32) for t in range(12)]
    with pv.make("cartpole", backend="multiprocessing", num_envs=6, num_workers=3, seed=4,
                 overwork=True) as env, \
            pv.make("cartpole", backend="multiprocessing", num_envs=6, num_workers=3, seed=4,
                    overwork=True) as ref:
        with pytest.raises(ValueError, match="divisible by 2, this env has num_workers=3"):
            env.worker_groups(2)
        first, second, third = env.worker_groups(3)
        assert (first.begin, first.end, third.end) == (0, 2, 6)
        assert np.shares_memory(second.observations, env.observations[2:4])
        for t, step_actions in enumerate(actions):
            ref.step(step_actions)
            order = (first, second, third) if t % 2 else (third, first, second)
            for group in order:
                group.start(np.ascontiguousarray(step_actions[group.begin:group.end]))
            for group in reversed(order):
                group.finish()
            np.testing.assert_array_equal(env.observations, ref.observations)
            np.testing.assert_array_equal(env.terminals, ref.terminals)
        with pytest.raises(ValueError, match="out of range"):
            first.start(np.array([0, 2], np.int32))
        assert env.episode_stats().count == ref.episode_stats().count > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_envs=6, num_workers=4, overwork=True), "must be divisible by num_workers"),
    (dict(num_envs=8, num_workers=2, batch_size=3, overwork=True),
     "batch_size \\(3\\) must be a multiple"),
    (dict(num_envs=8, num_workers=2, batch_size=16, overwork=True), "at most num_envs"),
    (dict(num_envs=0), "num_envs must be an int >= 1"),
    (dict(num_envs=4, num_workers=2, start_method="threads"), "start_method must be"),
])
def test_impossible_settings_are_refused_before_any_process_starts(kwargs, message,
                                                                  monkeypatch):
    """No segment of this process's is left (compared with /dev/shm as a whole, a
    segment another xdist worker's test held at that moment failed it)."""
    ours = record_segments(monkeypatch)
    with pytest.raises(ValueError, match=message):
        pv.make("cartpole", backend="multiprocessing", **kwargs)
    assert not ours & shm_segments()


def _self_of_failed_init(excinfo):
    """The `self` in the Multiprocessing.__init__ frame a refusal came out of (what
    pytest's traceback, a debugger or a logger calls repr() on)."""
    for entry in excinfo.traceback:
        if entry.name == "__init__" and type(entry.locals.get("self")) is pv.Multiprocessing:
            return entry.locals["self"]
    raise AssertionError("no Multiprocessing.__init__ frame in the traceback")


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_envs=4, start_method="threads"), "start_method must be"),      # before _setup
    (dict(num_envs=6, num_workers=4, overwork=True), "must be divisible"),   # inside _setup
])
def test_repr_of_a_multiprocessing_whose_init_raised(kwargs, message):
    with pytest.raises(ValueError, match=message) as failed:
        pv.make("cartpole", backend="multiprocessing", **kwargs)
    assert repr(_self_of_failed_init(failed)) == "<Multiprocessing, not constructed>"


def test_repr_of_a_multiprocessing_names_its_batch():
    with pv.make("cartpole", backend="multiprocessing", num_envs=2) as env:
        assert repr(env) == "Multiprocessing('cartpole', num_envs=2, num_workers=1, batch_size=2)"


def test_bad_arguments_of_make():
    with pytest.raises(ValueError, match="backend must be one of"):
        pv.make("cartpole", backend="threads")
    with pytest.raises(ValueError, match="needs a registered env name"):
        pv.make(gym_cartpole, backend="native")
    with pytest.raises(ValueError, match="unknown env"):
        pv.make("no-such-env", backend="serial")
    with pytest.raises(ValueError, match="only accepted with a registered env name"):
        pv.make(gym_cartpole, backend="serial", max_steps=5)
    with pytest.raises(ValueError, match="unknown config field"):
        pv.make("cartpole", backend="serial", num_envs=2, not_a_field=1)
    with pytest.raises(ValueError, match="seed must be"):
        pv.make("cartpole", backend="serial", seed=-1)
    with pytest.raises(ValueError, match="batch_size must equal num_envs"):
        pv.make("cartpole", backend="serial", num_envs=4, num_workers=2, batch_size=2)
    with pytest.raises(ValueError, match="shape \\(4,\\)"):
        with pv.make("cartpole", backend="serial", num_envs=4) as env:
            env.step(np.zeros(3, np.int32))


def test_every_backend_has_the_native_interface():
    for backend, extra in (("native", {}), ("serial", {"num_workers": 2}),
                           ("multiprocessing", {"num_workers": 2, "overwork": True})):
        with pv.make("cartpole", backend=backend, num_envs=4, seed=0, max_steps=20,
                     **extra) as env:
            for name in ("num_envs", "num_agents", "agents_per_env", "single_observation_space",
                         "single_action_space", "observation_space", "action_space",
                         "final_observations", "masks", "episode_stats", "close"):
                assert hasattr(env, name), (backend, name)
            assert env.observation_space.shape == (4, 4)
            observations, infos = env.reset(seed=0)
            assert infos == {} and observations is env.observations
            for _ in range(25):
                outputs = env.step(np.zeros(4, np.int32))
            assert outputs[0] is env.observations and outputs[4] == {}
            stats = env.episode_stats(clear=False)
            assert stats.count > 0 and env.episode_stats().count == stats.count


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_exact_state_and_stream_seeding_for_native_envs(backend):
    """get_state/set_state/seed_streams route to the right block: a copy of one
    env's states and streams continues bit for bit like the original."""
    actions = np.random.default_rng(1).integers(0, 2, (60, 4)).astype(np.int32)
    with pv.make("cartpole", backend=backend, num_envs=4, num_workers=2, seed=0,
                 overwork=True) as env, \
            pv.make("cartpole", backend=backend, num_envs=4, num_workers=2, seed=99,
                    overwork=True) as copy:
        env.reset(seed=0)
        for step_actions in actions[:20]:
            env.step(step_actions)
        for i in range(4):
            copy.set_state(i, env.get_state(i))
        env.seed_streams(1234)
        copy.seed_streams(1234)
        np.testing.assert_array_equal(copy.observations, env.observations)
        for step_actions in actions[20:]:
            env.step(step_actions)
            copy.step(step_actions)
            np.testing.assert_array_equal(copy.observations, env.observations)
        assert env.get_state(3).shape == (5,)
        with pytest.raises(IndexError, match="out of range"):
            env.get_state(4)
    with pv.make(gym_cartpole, backend=backend, num_envs=2, num_workers=2,
                 overwork=True) as emulated:
        assert not hasattr(emulated, "seed_streams") and not hasattr(emulated, "get_state")


def _cartpole_pair():
    import peregrine
    return peregrine.make("cartpole", num_envs=2, max_steps=30)


def test_callable_returning_a_native_batch_is_copied_into_the_rows():
    actions = np.random.default_rng(2).integers(0, 2, (80, 8)).astype(np.int32)
    with pv.make(_cartpole_pair, backend="serial", num_envs=8, num_workers=2, seed=5) as serial:
        assert serial.envs_per_unit == 2 and len(serial.blocks[0].units) == 2
        serial_trace, serial_stats = _run(serial, actions, seed=5)
    with pv.make(_cartpole_pair, backend="multiprocessing", num_envs=8, num_workers=2,
                 seed=5, overwork=True) as multi:
        multi_trace, multi_stats = _run(multi, actions, seed=5)
    _assert_same(serial_trace, multi_trace)
    assert serial_stats == multi_stats and serial_stats.count > 0
    assert serial_stats.mean["episode_length"] <= 30
    with pytest.raises(ValueError, match="multiple of the 2 instances"):
        pv.make(_cartpole_pair, backend="serial", num_envs=3)
