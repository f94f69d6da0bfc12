"""Pendulum, MountainCar and MountainCarContinuous: the C batches against
Gymnasium (one step from identical states) and against their NumPy
references (bit for bit over long rollouts)."""
import gymnasium
import numpy as np
import pytest

import peregrine
from peregrine.envs.mountain_car.reference import MountainCarReference
from peregrine.envs.mountain_car_continuous.reference import MountainCarContinuousReference
from peregrine.envs.pendulum.reference import PendulumReference
from peregrine.envs.registry import GYMNASIUM_IDS

f32 = np.float32
CLASSIC = ["pendulum", "mountain_car", "mountain_car_continuous"]
REFERENCES = {"pendulum": PendulumReference, "mountain_car": MountainCarReference,
              "mountain_car_continuous": MountainCarContinuousReference}


# ---- policies that reach every branch (goal, walls, clipping) -----------------

def pendulum_actions(rng, observations):
    """Random torques, a quarter beyond the +-2 limit, a few NaN/inf."""
    actions = rng.uniform(-3, 3, (len(observations), 1)).astype(np.float32)
    actions[rng.random(len(actions)) < 0.01] = np.nan
    actions[rng.random(len(actions)) < 0.01] = -np.inf
    return actions


def mountain_car_actions(rng, observations):
    """Pump energy (push along the velocity) with 25% random actions: reaches
    the goal in ~100 steps, and the random rows hit the left wall and time out."""
    actions = np.where(observations[:, 1] >= 0, 2, 0).astype(np.int32)
    noisy = rng.random(len(actions)) < 0.25
    actions[noisy] = rng.integers(0, 3, noisy.sum())
    return actions


def mountain_car_continuous_actions(rng, observations):
    """Pumping with noise, some beyond +-1 (clipped, but charged), a few NaN/inf."""
    actions = np.sign(observations[:, 1:2]) * rng.uniform(0, 1.5, (len(observations), 1))
    actions = actions.astype(np.float32)
    actions[rng.random(len(actions)) < 0.3] *= -1
    idle = np.arange(len(actions)) % 4 == 0  # these rows dither and time out
    actions[idle] = rng.uniform(-0.2, 0.2, (idle.sum(), 1))
    actions[rng.random(len(actions)) < 0.01] = np.nan
    actions[rng.random(len(actions)) < 0.01] = np.inf
    return actions


POLICIES = {"pendulum": pendulum_actions, "mountain_car": mountain_car_actions,
            "mountain_car_continuous": mountain_car_continuous_actions}


@pytest.mark.parametrize("name,steps", [("pendulum", 1000), ("mountain_car", 1500),
                                        ("mountain_car_continuous", 2500)])
def test_matches_numpy_reference_bit_for_bit_over_long_rollouts(name, steps):
    num_envs, seed = 64, 2024
    env = peregrine.make(name, num_envs=num_envs, seed=seed)
    reference = REFERENCES[name](num_envs, seed=seed)
    np.testing.assert_array_equal(env.observations, reference.observations())
    rng = np.random.default_rng(3)
    endings = terminations = 0
    for _ in range(steps):
        actions = POLICIES[name](rng, env.observations)
        obs, rewards, terminals, truncations, _ = env.step(actions)
        ref_obs, ref_rewards, ref_terminals, ref_truncations, _ = reference.step(actions)
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(rewards, ref_rewards)
        np.testing.assert_array_equal(terminals, ref_terminals)
        np.testing.assert_array_equal(truncations, ref_truncations)
        assert not (terminals & truncations).any()
        ended = terminals | truncations
        np.testing.assert_array_equal(env.final_observations[ended],
                                      reference.final_observations[ended])
        endings += ended.sum()
        terminations += terminals.sum()
    if name != "pendulum":
        assert 0 < terminations < endings  # both goal and time limit were exercised
    stats = env.episode_stats()
    assert stats.count == endings == len(reference.episode_returns)
    assert stats.mean["episode_return"] == pytest.approx(np.mean(reference.episode_returns))
    assert stats.std["episode_return"] == pytest.approx(np.std(reference.episode_returns))
    assert stats.mean["episode_length"] == pytest.approx(np.mean(reference.episode_lengths))
    if name != "pendulum":
        assert stats.mean["success"] == pytest.approx(np.mean(reference.episode_successes))
        assert stats.mean["success"] == pytest.approx(terminations / endings)


# ---- one step from identical states against Gymnasium --------------------------

def pendulum_states(rng, count):
    """Angles over several turns (the C core wraps them), speeds up to and at the limit."""
    theta = rng.uniform(-np.pi, np.pi, count)
    theta[: count // 4] = rng.uniform(-20, 20, count // 4)
    theta_dot = rng.uniform(-8, 8, count)
    theta_dot[count // 4: count // 2] = rng.choice([-8.0, 8.0], count // 4)
    actions = rng.uniform(-3, 3, (count, 1))
    return np.stack([theta, theta_dot], 1).astype(np.float32), actions.astype(np.float32)


def mountain_car_states(rng, count, goal):
    """Uniform states, plus states straddling the goal, at the left wall and at max speed."""
    position = rng.uniform(-1.2, 0.6, count)
    velocity = rng.uniform(-0.07, 0.07, count)
    quarter = count // 4
    position[:quarter] = goal + rng.uniform(-0.03, 0.01, quarter)        # the goal line
    velocity[:quarter] = rng.uniform(-0.01, 0.03, quarter)
    position[quarter:2 * quarter] = -1.2 + rng.uniform(0, 0.02, quarter)  # the left wall
    velocity[quarter:2 * quarter] = rng.uniform(-0.07, 0.005, quarter)
    position[2 * quarter:2 * quarter + 20] = -1.2                           # exactly on it
    velocity[2 * quarter + 20:3 * quarter] = rng.choice([-0.07, 0.07], quarter - 20)
    position[3 * quarter:3 * quarter + 20] = 0.6                            # the right edge
    return np.stack([position, velocity], 1).astype(np.float32)


def identical_states(name, rng, count):
    """(our states, Gymnasium states, actions) for `count` random cases."""
    if name == "pendulum":
        states, actions = pendulum_states(rng, count)
        return states, states.astype(np.float64), actions
    goal = 0.5 if name == "mountain_car" else 0.45
    states = mountain_car_states(rng, count, goal)
    if name == "mountain_car":
        actions = rng.integers(0, 3, count).astype(np.int32)
    else:
        actions = rng.uniform(-1.5, 1.5, (count, 1)).astype(np.float32)
    return states, states.astype(np.float64), actions


@pytest.mark.parametrize("name", CLASSIC)
def test_matches_gymnasium_from_the_same_state_and_action(name):
    rng = np.random.default_rng(11)
    count = 2000
    states, gym_states, actions = identical_states(name, rng, count)
    env = peregrine.make(name, num_envs=count, seed=0)
    extra = [0] * (env.get_state(0).size - 2)  # steps taken (and return so far) = 0
    for i in range(count):
        env.set_state(i, [*states[i], *extra])
    observations, rewards, terminals, truncations, _ = env.step(actions)
    # a terminated row was reset; its next state is in final_observations
    next_observations = np.where(terminals[:, None], env.final_observations, observations)
    assert not truncations.any()

    gym_env = gymnasium.make(GYMNASIUM_IDS[name]).unwrapped
    gym_env.reset(seed=0)
    goal = getattr(gym_env, "goal_position", None)
    terminated_seen = undecidable = 0
    for i in range(count):
        gym_env.state = gym_states[i].copy()
        action = int(actions[i]) if name == "mountain_car" else actions[i].copy()
        expected, reward, terminated, truncated, _ = gym_env.step(action)
        np.testing.assert_allclose(next_observations[i], expected, atol=1e-5, rtol=0,
                                   err_msg=f"row {i}: state {states[i]}, action {actions[i]}")
        assert rewards[i] == pytest.approx(reward, abs=1e-5), (i, states[i], actions[i])
        assert not truncated
        if goal is not None and abs(float(gym_env.state[0]) - goal) < 1e-6:
            undecidable += 1  # float32 vs float64 rounding may decide the goal test differently
        else:
            assert bool(terminals[i]) == terminated, (i, states[i], actions[i])
        terminated_seen += terminated
    assert undecidable <= 2
    if name == "pendulum":
        assert terminated_seen == 0 and not terminals.any()
    else:
        assert 0.05 * count < terminated_seen < 0.5 * count  # the goal test was exercised
        # the wall stopped the cars that hit it moving left
        at_wall = next_observations[:, 0] == f32(-1.2)
        assert at_wall.sum() > 50 and np.all(next_observations[at_wall, 1] >= 0)


# ---- time limits, final observations --------------------------------------------

@pytest.mark.parametrize("name,state", [("pendulum", [3.0, 0.5]), ("mountain_car", [-0.5, 0.0]),
                                        ("mountain_car_continuous", [-0.5, 0.0])])
def test_truncation_at_max_steps_keeps_final_observation_and_is_not_terminal(name, state):
    env = peregrine.make(name, num_envs=4, seed=0)
    max_steps = env.config["max_steps"]
    assert max_steps == {"pendulum": 200, "mountain_car": 200, "mountain_car_continuous": 999}[name]
    extra = [0.0] * (env.get_state(0).size - 3)
    for i in range(4):
        env.set_state(i, [*state, max_steps - 1, *extra])  # one step left
    actions = np.zeros(env.action_space.shape, env.action_space.dtype)
    before = env.observations.copy()
    obs, rewards, terminals, truncations, _ = env.step(actions)
    assert truncations.all() and not terminals.any()
    # final observation is the state after the step, not the fresh reset
    gym_env = gymnasium.make(GYMNASIUM_IDS[name]).unwrapped
    gym_env.reset(seed=0)
    gym_env.state = np.array(state, np.float64)
    expected, *_ = gym_env.step(actions[0] if actions.ndim == 2 else int(actions[0]))
    np.testing.assert_allclose(env.final_observations, np.tile(expected, (4, 1)), atol=1e-5)
    assert not np.array_equal(env.final_observations, before)
    assert not np.array_equal(obs, env.final_observations)
    stats = env.episode_stats()
    assert stats.count == 4 and stats.mean["episode_length"] == max_steps
    # the fresh episodes start from the reset distribution
    if name == "pendulum":
        np.testing.assert_allclose(obs[:, 0] ** 2 + obs[:, 1] ** 2, 1, atol=1e-6)
        assert np.all(np.abs(obs[:, 2]) <= 1)
    else:
        assert np.all((obs[:, 0] >= -0.6) & (obs[:, 0] < -0.4)) and np.all(obs[:, 1] == 0)


@pytest.mark.parametrize("name", ["mountain_car", "mountain_car_continuous"])
def test_goal_on_the_last_step_is_terminal_only_and_counts_as_success(name):
    env = peregrine.make(name, num_envs=2, seed=0)
    max_steps = env.config["max_steps"]
    extra = [0.0] * (env.get_state(0).size - 3)
    env.set_state(0, [0.55, 0.05, max_steps - 1, *extra])  # reaches the goal now
    env.set_state(1, [-0.5, 0.0, max_steps - 1, *extra])   # runs out of time
    if name == "mountain_car":
        actions = np.array([2, 1], np.int32)
    else:
        actions = np.array([[1.0], [0.0]], np.float32)
    _, rewards, terminals, truncations, _ = env.step(actions)
    assert terminals.tolist() == [True, False] and truncations.tolist() == [False, True]
    if name == "mountain_car_continuous":
        assert rewards[0] == pytest.approx(100 - 0.1) and rewards[1] == 0
    stats = env.episode_stats()
    assert stats.count == 2 and stats.mean["success"] == 0.5


# ---- behaviour ---------------------------------------------------------------

def test_energy_pumping_solves_mountain_car_and_random_play_does_not():
    env = peregrine.make("mountain_car", num_envs=256, seed=1)
    for _ in range(400):
        env.step(np.where(env.observations[:, 1] >= 0, 2, 0).astype(np.int32))
    pumping = env.episode_stats()
    assert pumping.count > 256 and pumping.mean["success"] == 1.0
    assert -200 < pumping.mean["episode_return"] < -80  # Gymnasium's "solved" is -110
    env = peregrine.make("mountain_car", num_envs=256, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(400):
        env.step(rng.integers(0, 3, 256).astype(np.int32))
    random = env.episode_stats()
    assert random.mean["success"] < 0.05 and random.mean["episode_return"] < -195


def test_pendulum_random_policy_return_matches_gymnasium():
    env = peregrine.make("pendulum", num_envs=512, seed=5)
    env.action_space.seed(0)
    for _ in range(400):
        env.step(env.action_space.sample())
    ours = env.episode_stats()
    gym_env = gymnasium.make("Pendulum-v1")
    gym_env.action_space.seed(0)
    returns = []
    for episode in range(40):
        gym_env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = gym_env.step(gym_env.action_space.sample())
            total, done = total + reward, terminated or truncated
        returns.append(total)
    assert ours.count == 1024
    # same distribution: means agree within a few standard errors
    standard_error = np.hypot(ours.std["episode_return"] / np.sqrt(ours.count),
                              np.std(returns) / np.sqrt(len(returns)))
    assert abs(ours.mean["episode_return"] - np.mean(returns)) < 4 * standard_error


@pytest.mark.parametrize("name", ["pendulum", "mountain_car_continuous"])
def test_nan_and_inf_actions_act_as_zero(name):
    env = peregrine.make(name, num_envs=4, seed=9)
    twin = peregrine.make(name, num_envs=4, seed=9)
    actions = np.array([[np.nan], [np.inf], [-np.inf], [0.0]], np.float32)
    obs, rewards, _, _, _ = env.step(actions)
    twin_obs, twin_rewards, _, _, _ = twin.step(np.zeros((4, 1), np.float32))
    np.testing.assert_array_equal(obs, twin_obs)
    np.testing.assert_array_equal(rewards, twin_rewards)
    assert np.isfinite(obs).all() and np.isfinite(rewards).all()
    huge = env.step(np.array([[3e38], [-3e38], [1e7], [-1e7]], np.float32))[1]
    assert np.isfinite(huge).all()


def test_mountain_car_continuous_charges_the_unclipped_action_like_gymnasium():
    env = peregrine.make("mountain_car_continuous", num_envs=2, seed=0)
    for i in range(2):
        env.set_state(i, [-0.5, 0.0, 0, 0])
    _, rewards, _, _, _ = env.step(np.array([[1.0], [3.0]], np.float32))
    np.testing.assert_allclose(rewards, [-0.1, -0.9], rtol=1e-6)
    # the force was clipped to 1: both cars moved the same
    assert env.observations[0, 1] == env.observations[1, 1]


def test_spaces_match_gymnasium():
    for name in CLASSIC:
        env = peregrine.make(name, num_envs=2, seed=0)
        gym_env = gymnasium.make(GYMNASIUM_IDS[name])
        ours_obs, theirs_obs = env.single_observation_space, gym_env.observation_space
        np.testing.assert_array_equal(ours_obs.low, theirs_obs.low)
        np.testing.assert_array_equal(ours_obs.high, theirs_obs.high)
        ours_act, theirs_act = env.single_action_space, gym_env.action_space
        if name == "mountain_car":
            assert ours_act.n == theirs_act.n == 3
        else:
            assert ours_act.shape == theirs_act.shape == (1,)
            np.testing.assert_array_equal(ours_act.low, theirs_act.low)
            np.testing.assert_array_equal(ours_act.high, theirs_act.high)
        assert env.observations in env.observation_space
    pendulum = peregrine.make("pendulum", num_envs=1, seed=0, max_torque=0.5, max_speed=4.0)
    assert pendulum.single_action_space.high[0] == f32(0.5)
    assert pendulum.single_observation_space.high[2] == f32(4.0)


@pytest.mark.parametrize("name", CLASSIC)
def test_thread_count_does_not_change_results(name):
    one = peregrine.make(name, num_envs=100, seed=4, num_threads=1)
    two = peregrine.make(name, num_envs=100, seed=4, num_threads=2)
    rng = np.random.default_rng(0)
    for _ in range(300):
        actions = POLICIES[name](rng, one.observations)
        np.testing.assert_array_equal(one.step(actions)[0], two.step(actions)[0])
    assert one.episode_stats() == two.episode_stats()


# ---- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("name", CLASSIC)
def test_bad_actions_are_refused_with_a_clear_error(name):
    env = peregrine.make(name, num_envs=8, seed=0)
    before = env.observations.copy()
    if name == "mountain_car":
        wrong = [np.zeros(8, np.int64), np.zeros((8, 1), np.int32), np.zeros(7, np.int32),
                 np.zeros(8, np.float32), [0] * 8]
    else:
        wrong = [np.zeros((8, 1), np.float64), np.zeros(8, np.float32),
                 np.zeros((8, 2), np.float32), np.zeros((8, 1), np.int32), [[0.0]] * 8]
    for actions in wrong:
        with pytest.raises(ValueError, match="actions"):
            env.step(actions)
    if name == "mountain_car":
        for bad in (3, -1):
            actions = np.ones(8, np.int32)
            actions[5] = bad
            with pytest.raises(ValueError, match="out of range"):
                env.step(actions)
    np.testing.assert_array_equal(env.observations, before)  # nothing moved


@pytest.mark.parametrize("name,bad", [("pendulum", [0.0, 9.0, 0, 0]),
                                      ("pendulum", [0.0, 0.0, 200, 0]),
                                      ("mountain_car", [0.7, 0.0, 0]),
                                      ("mountain_car", [-0.5, 0.08, 0]),
                                      ("mountain_car", [-0.5, 0.0, 1.5]),
                                      ("mountain_car_continuous", [-1.3, 0.0, 0, 0]),
                                      ("mountain_car_continuous", [1e300, 0.0, 0, 0])])
def test_impossible_states_are_refused(name, bad):
    env = peregrine.make(name, num_envs=1, seed=0)
    with pytest.raises(ValueError):
        env.set_state(0, bad)


@pytest.mark.parametrize("name,field,value", [("pendulum", "dt", 0.0), ("pendulum", "max_torque", -1),
                                              ("mountain_car", "max_steps", 0),
                                              ("mountain_car_continuous", "goal_position", 1.0)])
def test_bad_config_names_the_field(name, field, value):
    with pytest.raises(ValueError, match=field):
        peregrine.make(name, num_envs=1, **{field: value})
