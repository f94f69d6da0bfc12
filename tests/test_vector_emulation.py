"""Emulation: Gymnasium and PettingZoo envs behind the native batch contract."""
from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import peregrine.vector as pv
from peregrine.vector.spaces import FlatAction, FlatObservation, unflatten

from test_vector_helpers import NestedEnv, Squad, gym_cartpole


# ---- spaces ------------------------------------------------------------------------

def test_nested_observation_flattens_and_unflattens_exactly():
    env = NestedEnv()
    flat = FlatObservation(env.observation_space)
    assert flat.size == 6 + 2 + 1 + 1
    assert flat.space.dtype == np.float32 and flat.space.shape == (10,)
    env.reset(seed=3)
    env.t = 4
    observation = env._obs()
    rows = np.zeros((2, flat.size), np.float32)
    flat.write(observation, rows[1])
    back = unflatten(rows, env.observation_space, cast=True)
    assert back["pos"].shape == (2, 2, 3) and back["pos"].dtype == np.float32
    np.testing.assert_array_equal(back["pos"][1], observation["pos"])
    np.testing.assert_array_equal(back["flags"][1], observation["flags"])
    assert back["flags"].dtype == np.int8
    assert back["inner"][0][1] == observation["inner"][0] == 6  # Discrete value, start kept
    np.testing.assert_array_equal(back["inner"][1][1], observation["inner"][1])
    assert np.all(rows[0] == 0)
    # Gymnasium's Dict sorts its keys: flags (2), inner (Discrete, Box), pos (6)
    assert [path for path, _, _ in flat.fields] == [("flags",), ("inner", 0), ("inner", 1),
                                                    ("pos",)]
    assert flat.space.low[2] == 2 and flat.space.high[2] == 6  # Discrete(5, start=2)


def test_unflatten_works_on_torch_tensors():
    torch = pytest.importorskip("torch")
    env = NestedEnv()
    flat = torch.arange(20, dtype=torch.float32).reshape(2, 10)
    back = unflatten(flat, env.observation_space)
    assert back["pos"].shape == (2, 2, 3)
    assert back["inner"][0].shape == (2,)
    assert torch.equal(back["inner"][0], torch.tensor([2.0, 12.0]))


def test_action_spaces_map_to_native_kinds():
    # Discrete and MultiDiscrete keep the wrapped space's dtype (Gymnasium's int64)
    assert FlatAction(spaces.Discrete(4, start=-1)).space == spaces.Discrete(4)
    assert FlatAction(spaces.Discrete(4, start=-1)).space.dtype == np.int64
    assert FlatAction(spaces.Discrete(4, start=-1)).to_env(np.int64(0)) == -1
    assert FlatAction(spaces.Discrete(4, dtype=np.int32)).space.dtype == np.int32
    assert FlatAction(spaces.MultiDiscrete([3, 2])).space == spaces.MultiDiscrete([3, 2])
    nested = FlatAction(NestedEnv().action_space)
    assert nested.space == spaces.MultiDiscrete([3, 2, 4], dtype=np.int32)
    first, second = nested.to_env(np.array([2, 1, 3], np.int32))
    assert first == 3 and second.tolist() == [1, 3]
    box = FlatAction(spaces.Box(-2, 2, (2, 2), np.float64))
    assert box.space.shape == (4,) and box.space.dtype == np.float32
    value = box.to_env(np.array([1, np.nan, np.inf, -1], np.float32))
    assert value.shape == (2, 2) and value.dtype == np.float64
    assert value.ravel().tolist() == [1, 0, 0, -1]  # NaN/inf -> 0, as native envs do
    assert FlatAction(spaces.MultiBinary(3)).space == spaces.MultiDiscrete([2, 2, 2],
                                                                          dtype=np.int32)
    with pytest.raises(ValueError, match="mixes discrete and continuous"):
        FlatAction(spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (1,)))))
    with pytest.raises(ValueError, match="cannot flatten space"):
        FlatObservation(spaces.Text(5))


def test_uint8_image_observations_stay_uint8():
    flat = FlatObservation(spaces.Box(0, 255, (4, 4, 3), np.uint8))
    assert flat.space.dtype == np.uint8 and flat.space.shape == (48,)


# ---- Gymnasium -----------------------------------------------------------------------

def test_nested_gymnasium_env_through_serial():
    with pv.make(lambda: NestedEnv(length=3), backend="serial", num_envs=2, seed=5) as env:
        assert env.single_action_space == spaces.MultiDiscrete([3, 2, 4], dtype=np.int32)
        observations, _ = env.reset(seed=5)
        structured = unflatten(observations, NestedEnv().observation_space)
        # unit seeds differ per env, so the two offsets differ
        assert structured["pos"][0, 0, 0] != structured["pos"][1, 0, 0]
        actions = np.array([[2, 1, 3], [0, 0, 0]], np.int32)
        for step in range(3):
            observations, rewards, terminals, truncations, infos = env.step(actions)
        np.testing.assert_array_equal(rewards, [3 + 1 + 3, 1 + 0 + 0])
        assert terminals.tolist() == [True, True] and not truncations.any()
        final = unflatten(env.final_observations, NestedEnv().observation_space)
        assert np.all(final["pos"][:, 0, 0] - structured["pos"][:, 0, 0] == 3)  # t = 3 at the end
        fresh = unflatten(observations, NestedEnv().observation_space)
        np.testing.assert_array_equal(fresh["pos"], structured["pos"])  # auto-reset, same step
        stats = env.episode_stats()
        assert stats.count == 2
        assert stats.mean["episode_length"] == 3
        assert stats.mean["episode_return"] == pytest.approx((21 + 3) / 2)
        assert env.episode_stats().count == 0


def _native_state_from(gym_env, steps):
    x, x_dot, theta, theta_dot = gym_env.unwrapped.state
    return [x, x_dot, theta, theta_dot, steps]


def test_emulated_gymnasium_cartpole_matches_native_cartpole():
    limit = 40
    emulated = pv.make(lambda: gym_cartpole(limit), backend="serial", num_envs=1, seed=1)
    native = pv.make("cartpole", backend="native", num_envs=1, seed=1, max_steps=limit)
    with emulated, native:
        assert emulated.single_observation_space.shape == native.single_observation_space.shape
        assert emulated.single_observation_space.dtype == native.single_observation_space.dtype
        # Gymnasium's Discrete(2) keeps its int64; the native env's is int32
        assert emulated.single_action_space == spaces.Discrete(2)
        assert native.single_action_space == spaces.Discrete(2, dtype=np.int32)
        # the flattened emulated space writes unbounded as +-float32 max; the native
        # space keeps Gymnasium's +-inf
        big = np.finfo(np.float32).max
        np.testing.assert_allclose(emulated.single_observation_space.high,
                                   np.clip(native.single_observation_space.high, -big, big),
                                   rtol=1e-6)
        gym_env = emulated.blocks[0].units[0].env
        rng = np.random.default_rng(0)
        outcomes = {"terminal": 0, "truncation": 0}
        t = 0
        for step in range(400):
            # one-step parity from the same state (the physics is chaotic: float32
            # vs float64 drift apart over long runs, by design)
            native.set_state(0, _native_state_from(gym_env, t))
            np.testing.assert_allclose(native.observations, emulated.observations, atol=1e-6)
            theta_dot = emulated.observations[0, 3]
            # mostly balance (to reach truncations), sometimes act randomly
            action = int(theta_dot > 0) if step % 80 < 60 else int(rng.integers(2))
            e_obs, e_rew, e_term, e_trunc, _ = emulated.step(np.array([action], np.int64))
            n_obs, n_rew, n_term, n_trunc, _ = native.step(np.array([action], np.int32))
            assert e_rew[0] == n_rew[0] == 1.0
            assert (e_term[0], e_trunc[0]) == (n_term[0], n_trunc[0])
            if e_term[0] or e_trunc[0]:
                np.testing.assert_allclose(emulated.final_observations, native.final_observations,
                                           atol=1e-5)
                outcomes["terminal" if e_term[0] else "truncation"] += 1
                t = 0
            else:
                np.testing.assert_allclose(e_obs, n_obs, atol=1e-5)
                t += 1
        assert outcomes["terminal"] > 0 and outcomes["truncation"] > 0
        e_stats, n_stats = emulated.episode_stats(), native.episode_stats()
        assert e_stats.count == n_stats.count == sum(outcomes.values())
        assert e_stats.mean == pytest.approx(n_stats.mean)


def test_gymnasium_truncation_at_time_limit_is_not_terminal():
    with pv.make(lambda: gym_cartpole(5), backend="serial", num_envs=1, seed=0) as env:
        env.reset(seed=0)
        flags = []
        for _ in range(5):
            _, _, terminals, truncations, _ = env.step(np.array([0], np.int64))
            flags.append((bool(terminals[0]), bool(truncations[0])))
        assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])


def test_emulation_refuses_bad_actions_and_objects():
    with pv.make(gym_cartpole, backend="serial", num_envs=2, seed=0) as env:
        with pytest.raises(ValueError, match="dtype int64"):
            env.step(np.zeros(2, np.float32))
        with pytest.raises(ValueError, match="out of range"):
            env.step(np.array([0, 2], np.int64))
        with pytest.raises(ValueError, match="out of range"):
            env.step(np.array([-1, 0], np.int64))
    with pytest.raises(ValueError, match="gymnasium.Env or VectorEnv, a PettingZoo ParallelEnv"):
        pv.make(lambda: object(), backend="serial", num_envs=1)


# ---- PettingZoo --------------------------------------------------------------------------

def test_pettingzoo_agents_are_rows_with_masks():
    with pv.make(lambda: Squad(limit=10), backend="serial", num_envs=2, seed=0) as env:
        assert env.agents_per_env == 3 and env.num_agents == 6
        observations, _ = env.reset(seed=0)
        assert env.masks.all()
        np.testing.assert_array_equal(observations[:, 0], [0, 1, 2, 0, 1, 2])
        actions = np.tile(np.array([1, 2, 3], np.int64), 2)
        history = []
        for _ in range(4):
            observations, rewards, terminals, truncations, _ = env.step(actions)
            history.append((env.masks.copy(), rewards.copy(), terminals.copy()))
        # step 1: everyone acts; a0 terminates after 2 steps, a1 after 3, a2 after 4
        masks, rewards, terminals = history[0]
        assert masks.all() and rewards.tolist() == [1, 2, 3] * 2 and not terminals.any()
        masks, rewards, terminals = history[1]
        assert masks.all() and terminals.tolist() == [True, False, False] * 2
        masks, rewards, terminals = history[2]
        assert masks.tolist() == [False, True, True] * 2
        assert rewards.tolist() == [0, 2, 3] * 2
        assert terminals.tolist() == [False, True, False] * 2
        masks, rewards, terminals = history[3]
        # a2 ends: the episode is over and resets in the same step
        assert masks.tolist() == [False, False, True] * 2
        assert terminals.tolist() == [False, False, True] * 2
        assert env.final_observations[2].tolist() == [2, 4, 3]
        assert observations[:, 1].tolist() == [0] * 6  # new episode, step 0
        stats = env.episode_stats()
        assert stats.count == 2
        assert stats.mean["episode_length"] == 4
        assert stats.mean["episode_return"] == pytest.approx((1 * 2 + 2 * 3 + 3 * 4) / 3)
        # the next step is a full new episode: everyone acts again
        env.step(actions)
        assert env.masks.all()


def test_pettingzoo_truncation_for_agents_still_live():
    with pv.make(lambda: Squad(limit=3), backend="serial", num_envs=1, seed=0) as env:
        env.reset(seed=0)
        for _ in range(3):
            _, _, terminals, truncations, _ = env.step(np.zeros(3, np.int64))
        assert terminals.tolist() == [False, True, False]  # a1 terminates at 3 as well
        assert truncations.tolist() == [False, False, True]
        assert env.episode_stats().count == 1


def test_pettingzoo_refuses_agents_with_different_spaces():
    class Mixed(Squad):
        def action_space(self, agent):
            return spaces.Discrete(4 if agent != "a2" else 5)
    with pytest.raises(ValueError, match="different spaces"):
        pv.make(Mixed, backend="serial", num_envs=1)


def test_a_pettingzoo_aec_env_from_a_callable_is_converted():
    """`vector.make(lambda: rps_v2.env())`: an AEC env, converted to its parallel form as
    a `module:function` name's is (it failed with "reset() returned NoneType ... the old
    Gym API's reset")."""
    rps_v2 = pytest.importorskip("pettingzoo.classic.rps_v2")
    env = pv.make(lambda: rps_v2.env(max_cycles=5), num_envs=2, backend="serial", seed=0)
    try:
        env.reset(seed=0)
        for _ in range(5):
            env.step(np.zeros(env.num_agents, env.actions.dtype))
        stats = env.episode_stats()
        assert stats.count == 2 and stats.mean["episode_length"] == 5.0
    finally:
        env.close()


def test_a_turn_based_aec_env_is_refused_by_name_and_as_an_object():
    """PettingZoo's classic games act one agent at a time: PettingZoo's converter asserted
    (a traceback), and a name said only that the module has no parallel_env."""
    tictactoe_v3 = pytest.importorskip("pettingzoo.classic.tictactoe_v3")
    with pytest.raises(ValueError, match=r"tictactoe_v3 is a turn-based PettingZoo env .* "
                                         r"turn-based self-play is not supported"):
        pv.make(tictactoe_v3.env, num_envs=1, backend="serial")
    with pytest.raises(ValueError, match=r"env 'pettingzoo:classic.tictactoe_v3' is a "
                                         r"turn-based PettingZoo env"):
        pv.make("pettingzoo:classic.tictactoe_v3", num_envs=1, backend="serial")


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
def test_a_first_reset_without_a_seed_plays_the_construction_seed(backend):
    """`vector.make(..., seed=5).reset()` is `reset(seed=5)` for an emulated env too, as
    for a native batch (it played seed 5's second episode: the construction had reset
    with it already); after a step, a reset without a seed continues each env's stream."""
    def first(reset_seed, step_first=False):
        env = pv.make("gym:CartPole-v1", num_envs=2, num_workers=2, seed=5, backend=backend)
        try:
            if step_first:
                env.reset()
                env.step(np.zeros(2, env.actions.dtype))
            return env.reset(seed=reset_seed)[0].copy()
        finally:
            env.close()
    np.testing.assert_array_equal(first(None), first(5))
    assert not np.array_equal(first(None, step_first=True), first(5))
