"""Gymnasium's own API over Peregrine: registered ids, the single-env view,
make_vec, the three autoreset modes, episode records, seeds and reset masks,
Gymnasium's vector wrappers, rendering, and the per-sub-env attribute calls."""
from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import peregrine
import peregrine.vector as pv
from peregrine.envs.registry import GYMNASIUM_IDS

from test_vector_helpers import Squad

CLASSIC = ["cartpole", "pendulum", "mountain_car", "mountain_car_continuous"]
SINGLE_AGENT = CLASSIC + ["prospector"]


def peregrine_id(name):
    return f"peregrine/{GYMNASIUM_IDS[name]}"


def cartpole_vec(num_envs=4, autoreset_mode=None, **kwargs):
    return gymnasium.make_vec(peregrine_id("cartpole"), num_envs=num_envs,
                              autoreset_mode=autoreset_mode, **kwargs)


# ---- registration ----------------------------------------------------------------------

def test_import_registers_every_env_and_builds_nothing():
    code = (
        "import sys, gymnasium;"
        # the module:id form imports peregrine itself, as Gymnasium documents
        "env = gymnasium.make('peregrine:peregrine/CartPole-v1'); env.close();"
        "import peregrine;"
        "ids = sorted(i for i in gymnasium.registry if i.startswith('peregrine/'));"
        "print(ids)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # the built-in ids, and any installed plugin's env under its own name
    from peregrine.envs.registry import ENVS
    plugins = [name for name in ENVS if ENVS.entry(name).source.startswith("plugin")]
    assert out.stdout.strip() == str(sorted([f"peregrine/{i}" for i in GYMNASIUM_IDS.values()]
                                            + [f"peregrine/{name}" for name in plugins]))
    # peregrine first: nothing but the registry (and the envs package face, whose
    # names load lazily) is imported, not even Gymnasium (a
    # hook registers the ids when Gymnasium is imported), and no env module,
    # extension or torch
    code = ("import sys, peregrine;"
            "print(sorted(m for m in sys.modules if m.startswith(('peregrine.', 'gymnasium'))"
            " or m == 'torch'));"
            "import gymnasium; print('peregrine/DroneSwarm-v0' in gymnasium.registry)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['peregrine.envs',", "'peregrine.envs.registry']", "True"]


def unbounded_as_max(bounds):
    """Gymnasium versions write an unbounded CartPole velocity as +-inf or as
    +-float32 max; both mean the same."""
    big = np.finfo(np.float32).max
    return np.clip(bounds, -big, big)


@pytest.mark.parametrize("name", CLASSIC)
def test_classic_ids_have_gymnasium_limits_spaces_and_threshold(name):
    """Reusing Gymnasium's id promises Gymnasium's rules: the dynamics are
    checked step by step in test_cartpole.py and test_classic_control.py; here
    the step limit, the spaces and the reward threshold."""
    ours, theirs = gymnasium.spec(peregrine_id(name)), gymnasium.spec(GYMNASIUM_IDS[name])
    assert ours.reward_threshold == theirs.reward_threshold
    env, reference = gymnasium.make(ours.id), gymnasium.make(theirs.id)
    with env:
        # Gymnasium's TimeLimit ends the episodes, as for Gymnasium's own envs
        assert env.spec.max_episode_steps == ours.max_episode_steps == theirs.max_episode_steps
        np.testing.assert_array_equal(unbounded_as_max(env.observation_space.low),
                                      unbounded_as_max(reference.observation_space.low))
        np.testing.assert_array_equal(unbounded_as_max(env.observation_space.high),
                                      unbounded_as_max(reference.observation_space.high))
        if isinstance(reference.action_space, gymnasium.spaces.Discrete):
            assert env.action_space.n == reference.action_space.n
        else:
            np.testing.assert_array_equal(env.action_space.low, reference.action_space.low)
            np.testing.assert_array_equal(env.action_space.high, reference.action_space.high)


# ---- the single-env view --------------------------------------------------------------------

@pytest.mark.parametrize("name", SINGLE_AGENT)
def test_single_env_view_passes_gymnasium_check_env(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unbounded Box / asymmetric Box advice
        env = gymnasium.make(peregrine_id(name))
        check_env(env.unwrapped, skip_render_check=True)
        env.close()


def test_single_env_view_passes_sb3_check_env_and_make_vec_env():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_checker import check_env as sb3_check_env
    from stable_baselines3.common.env_util import make_vec_env
    env = gymnasium.make("peregrine/CartPole-v1")
    sb3_check_env(env)
    env.close()
    vec_env = make_vec_env("peregrine/CartPole-v1", n_envs=2, seed=0)
    vec_env.reset()
    for _ in range(60):
        _, _, _, infos = vec_env.step(np.array([0, 1]))
    assert vec_env.envs[0].get_episode_rewards()  # SB3's Monitor saw finished episodes
    vec_env.close()


def test_single_env_view_episode_end_and_reset():
    env = gymnasium.make("peregrine/CartPole-v1", max_steps=5)
    batch = env.unwrapped.batch
    observation, info = env.reset(seed=3)
    assert info == {} and observation.shape == (4,)
    np.testing.assert_array_equal(observation, peregrine.make("cartpole", seed=3).observations[0])
    for step in range(5):
        observation, reward, terminated, truncated, _ = env.step(1)  # a Python int
        assert reward == 1.0 and not terminated
    assert truncated
    # the episode's last observation, not the next episode's start
    np.testing.assert_array_equal(observation, batch.final_observations[0])
    start = batch.observations[0].copy()
    observation, _ = env.reset()  # the start the batch already drew
    np.testing.assert_array_equal(observation, start)
    observation, _ = env.reset()  # a new draw
    assert not np.array_equal(observation, start)
    with pytest.raises(ValueError, match="out of range"):
        env.step(2)
    with pytest.raises(ValueError, match="must be integers"):
        env.step(0.5)
    with pytest.raises(ValueError, match="reset options"):
        env.reset(options={"low": -0.1})
    env.close()


def test_multi_agent_env_refuses_the_single_env_view():
    with pytest.raises(ValueError, match=r"parallel_env\('drone_swarm'\)"):
        gymnasium.make("peregrine/DroneSwarm-v0")
    env = gymnasium.make("peregrine/DroneSwarm-v0", n_drones=1, render_mode="rgb_array")
    observation, _ = env.reset(seed=0)
    assert observation in env.observation_space
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    env.close()


def test_render_mode_is_refused_where_the_env_cannot_draw():
    # a TypeError, as from an env without render_mode: SB3's make_vec_env retries without
    inner = pv.make(lambda: Squad(limit=10), backend="serial", num_envs=1, seed=0)
    with pytest.raises(TypeError, match="can draw itself; Serial cannot"):
        pv.GymnasiumVectorEnv(inner, render_mode="rgb_array")
    inner.close()
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        gymnasium.make_vec("peregrine/DroneSwarm-v0", num_envs=1, render_mode="human")


# ---- make_vec and the autoreset modes ----------------------------------------------------------

def test_make_vec_passes_threads_and_config_to_the_native_batch():
    envs = cartpole_vec(num_envs=6, num_threads=2, max_steps=7, gravity=9.0)
    batch = envs.unwrapped.env
    assert envs.num_envs == 6 and batch.num_threads == 2
    assert batch.config["max_steps"] == 7 and batch.config["gravity"] == 9.0
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # Gymnasium's default
    envs.close()
    envs = cartpole_vec(num_envs=2, max_episode_steps=9)
    assert envs.unwrapped.env.config["max_steps"] == 9
    envs.close()
    with pytest.raises(ValueError, match="autoreset_mode must be one of"):
        cartpole_vec(autoreset_mode="sometimes")


def test_next_step_autoreset_returns_the_reset_on_the_following_step():
    envs = cartpole_vec(num_envs=3, max_steps=4)
    batch = envs.unwrapped.env
    envs.reset(seed=0)
    for _ in range(3):
        envs.step(np.ones(3, np.int64))
    observations, rewards, terminations, truncations, infos = envs.step(np.ones(3, np.int64))
    state_after_end = [batch.get_state(i) for i in range(3)]
    assert truncations.all() and not terminations.any()
    np.testing.assert_array_equal(observations, batch.final_observations)  # last observations
    assert "final_obs" not in infos
    starts = batch.observations.copy()  # the batch already drew the next episodes' starts
    assert not np.array_equal(starts, observations)
    observations, rewards, terminations, truncations, _ = envs.step(np.zeros(3, np.int64))
    np.testing.assert_array_equal(observations, starts)  # the reset step
    assert rewards.tolist() == [0, 0, 0] and not (terminations | truncations).any()
    # the action was ignored: the instances were not stepped
    np.testing.assert_array_equal([batch.get_state(i) for i in range(3)], state_after_end)
    for step in range(4):  # then a whole new episode of max_steps steps
        _, rewards, _, truncations, _ = envs.step(np.ones(3, np.int64))
        assert rewards.tolist() == [1, 1, 1] and truncations.all() == (step == 3)
    envs.close()


def test_same_step_and_disabled_autoreset():
    envs = cartpole_vec(num_envs=2, autoreset_mode=AutoresetMode.SAME_STEP, max_steps=2)
    envs.reset(seed=0)
    envs.step(np.ones(2, np.int64))
    observations, _, _, truncations, infos = envs.step(np.ones(2, np.int64))
    assert truncations.all() and infos["_final_obs"].all()
    np.testing.assert_array_equal(observations, envs.unwrapped.env.observations)  # reset already
    envs.close()

    envs = cartpole_vec(num_envs=3, autoreset_mode="Disabled", max_steps=2)
    batch = envs.unwrapped.env
    envs.reset(seed=0)
    envs.step(np.ones(3, np.int64))
    observations, _, _, truncations, _ = envs.step(np.ones(3, np.int64))
    assert truncations.all()
    np.testing.assert_array_equal(observations, batch.final_observations)
    with pytest.raises(RuntimeError, match="autoreset is disabled"):
        envs.step(np.ones(3, np.int64))
    starts, finals = batch.observations.copy(), batch.final_observations.copy()
    observations, _ = envs.reset(options={"reset_mask": np.array([True, True, False])})
    np.testing.assert_array_equal(observations[:2], starts[:2])
    np.testing.assert_array_equal(observations[2], finals[2])  # not reset yet
    with pytest.raises(RuntimeError, match=r"sub-envs \[2\] ended"):
        envs.step(np.ones(3, np.int64))
    envs.reset(options={"reset_mask": np.array([False, False, True])})
    _, rewards, _, truncations, _ = envs.step(np.ones(3, np.int64))
    assert rewards.tolist() == [1, 1, 1] and not truncations.any()
    envs.close()


def test_backends_default_to_same_step_and_refuse_the_other_modes():
    inner = pv.make(lambda: Squad(limit=10), backend="serial", num_envs=1, seed=0)
    with pv.GymnasiumVectorEnv(inner) as envs:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        with pytest.raises(ValueError, match="need a native batch"):
            envs.reset(seed=[1, 1, 1])
    inner = pv.make(lambda: Squad(limit=10), backend="serial", num_envs=1, seed=0)
    with pytest.raises(ValueError, match="needs a native batch"):
        pv.GymnasiumVectorEnv(inner, autoreset_mode=AutoresetMode.NEXT_STEP)
    inner.close()


# ---- seeds and reset masks ------------------------------------------------------------------------

def test_reset_with_per_row_seeds_and_masks():
    envs = cartpole_vec(num_envs=4)
    observations, _ = envs.reset(seed=[5, None, 7, 5])
    np.testing.assert_array_equal(observations[0], observations[3])
    np.testing.assert_array_equal(observations[0], peregrine.make("cartpole", seed=5).observations[0])
    np.testing.assert_array_equal(observations[2], peregrine.make("cartpole", seed=7).observations[0])
    envs.step(np.ones(4, np.int64))
    moved = envs.step(np.ones(4, np.int64))[0]
    observations, _ = envs.reset(options={"reset_mask": np.array([False, True, False, False])})
    np.testing.assert_array_equal(observations[[0, 2, 3]], moved[[0, 2, 3]])  # left alone
    assert np.all(np.abs(observations[1]) <= 0.05)  # a fresh start
    observations, _ = envs.reset(seed=9, options={"reset_mask": np.array([True, False] * 2)})
    np.testing.assert_array_equal(observations[0], peregrine.make("cartpole", seed=9).observations[0])
    np.testing.assert_array_equal(observations[2], peregrine.make("cartpole", seed=11).observations[0])
    with pytest.raises(ValueError, match="one seed per sub-env \\(4\\)"):
        envs.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="seed must be an int, None or a list .* got 1.5"):
        envs.reset(seed=1.5)        # was "TypeError: 'float' object is not iterable"
    with pytest.raises(ValueError, match="reset_mask'\\] must be a NumPy bool array"):
        envs.reset(options={"reset_mask": [True] * 4})
    with pytest.raises(ValueError, match="at least one"):
        envs.reset(options={"reset_mask": np.zeros(4, bool)})
    with pytest.raises(ValueError, match="unknown reset options"):
        envs.reset(options={"low": 0})
    envs.close()


def test_agents_of_one_instance_share_seeds_and_masks():
    envs = gymnasium.make_vec("peregrine/DroneSwarm-v0", num_envs=2, n_drones=2, n_victims=2)
    assert envs.num_envs == 4  # one sub-env per drone
    envs.reset(seed=[1, 1, 2, 2])
    with pytest.raises(ValueError, match="agents of one instance and need one seed"):
        envs.reset(seed=[1, 2, 3, 4])
    with pytest.raises(ValueError, match="must be selected together"):
        envs.reset(options={"reset_mask": np.array([True, False, False, False])})
    envs.close()


# ---- episode records -------------------------------------------------------------------------------

def test_cleanrl_ppo_logging_pattern_logs_episodes():
    """gymnasium.make_vec wrapped in Gymnasium's RecordEpisodeStatistics, as
    Gymnasium's own vector envs are: the usual logging code (CleanRL's gym-v1.1
    branch reads the records this way) sees every finished episode."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics
    envs = RecordEpisodeStatistics(gymnasium.make_vec("peregrine/CartPole-v1", num_envs=4))
    assert isinstance(envs.single_action_space, gymnasium.spaces.Discrete)
    logged = []
    next_obs, _ = envs.reset(seed=1)
    rng = np.random.default_rng(0)
    for global_step in range(0, 4 * 200, 4):
        action = rng.integers(0, 2, envs.num_envs)
        next_obs, reward, terminations, truncations, infos = envs.step(action)
        next_done = np.logical_or(terminations, truncations)
        # -- the logging code, as in CleanRL --
        if "episode" in infos:
            for idx, finished in enumerate(infos["_episode"]):
                if finished:
                    logged.append((infos["episode"]["r"][idx], infos["episode"]["l"][idx]))
    assert len(logged) > 20
    assert all(r == l and 1 <= l < 200 for r, l in logged)  # CartPole: reward 1 per step
    envs.close()


def test_episode_records_match_gymnasiums_record_episode_statistics():
    from gymnasium.wrappers.vector import RecordEpisodeStatistics
    ours = gymnasium.make_vec("peregrine/MountainCar-v0", num_envs=3, max_steps=30,
                              record_episode_statistics=True)
    theirs = RecordEpisodeStatistics(gymnasium.make_vec(
        "peregrine/MountainCar-v0", num_envs=3, max_steps=30))
    ours.reset(seed=4)
    theirs.reset(seed=4)
    rng, finished = np.random.default_rng(0), 0
    for _ in range(100):
        actions = rng.integers(0, 3, 3)
        _, _, _, _, our_infos = ours.step(actions)
        _, _, _, _, their_infos = theirs.step(actions)
        assert ("episode" in our_infos) == ("episode" in their_infos)
        if "episode" in our_infos:
            finished += int(our_infos["_episode"].sum())
            np.testing.assert_array_equal(our_infos["_episode"], their_infos["_episode"])
            for key in ("r", "l"):
                np.testing.assert_array_equal(our_infos["episode"][key],
                                              their_infos["episode"][key])
            # the env's own statistics ride along
            assert set(our_infos["episode"]) >= {"r", "l", "t", "success", "episode_length"}
            np.testing.assert_array_equal(our_infos["episode"]["episode_length"],
                                          our_infos["episode"]["l"])
    assert finished == 9  # three 30-step episodes per row, each with its reset step
    ours.close()
    theirs.close()
    # both records at once would be ambiguous: Gymnasium's wrapper refuses to overwrite
    wrapped = RecordEpisodeStatistics(gymnasium.make_vec("peregrine/MountainCar-v0",
                                                         num_envs=1, max_steps=1,
                                                         record_episode_statistics=True))
    wrapped.reset(seed=0)
    with pytest.raises(ValueError, match="already exists"):
        wrapped.step(np.zeros(1, np.int64))
    wrapped.close()


def test_gymnasium_vector_wrappers_run_on_the_export():
    from gymnasium.wrappers.vector import ClipAction, NormalizeObservation, NormalizeReward
    envs = NormalizeReward(NormalizeObservation(gymnasium.make_vec(
        "peregrine/CartPole-v1", num_envs=8, max_steps=50)))
    observations, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(120):
        observations, rewards, *_ = envs.step(rng.integers(0, 2, 8))
    assert abs(float(observations.mean())) < 1.0 and np.isfinite(rewards).all()
    assert envs.env.obs_rms.count > 8 * 100
    envs.close()
    envs = ClipAction(gymnasium.make_vec("peregrine/MountainCarContinuous-v0", num_envs=2))
    envs.reset(seed=0)
    _, rewards, *_ = envs.step(np.array([[5.0], [-0.5]], np.float32))
    # clipped to 1 before the env saw it: the action cost is 0.1 * 1^2, not 0.1 * 5^2
    np.testing.assert_allclose(rewards, [-0.1, -0.025], rtol=1e-5)
    envs.close()


# ---- rendering and the per-sub-env attribute calls ---------------------------------------------------

def test_rgb_array_frames_one_per_sub_env():
    envs = gymnasium.make_vec("peregrine/DroneSwarm-v0", num_envs=2, n_drones=2,
                              render_mode="rgb_array")
    envs.reset(seed=0)
    frames = envs.render()
    assert len(frames) == 4 and all(f.dtype == np.uint8 and f.shape[2] == 3 for f in frames)
    # rows of one instance show that instance, each with its own drone marked
    assert 0 < np.any(frames[0] != frames[1], axis=2).mean() < 0.02
    assert np.any(frames[0] != frames[2], axis=2).mean() > 0.02
    assert envs.metadata["render_fps"] > 0
    envs.close()


def test_record_video_writes_a_video(tmp_path):
    pytest.importorskip("moviepy")
    from gymnasium.wrappers.vector import RecordVideo
    envs = RecordVideo(gymnasium.make_vec("peregrine/DroneSwarm-v0", num_envs=1, n_drones=2,
                                          max_steps=10, render_mode="rgb_array"),
                       str(tmp_path / "videos"), episode_trigger=lambda episode: episode == 0)
    envs.reset(seed=0)
    for _ in range(12):
        envs.step(np.zeros((2, 3), np.float32))
    envs.close()
    assert any(path.suffix == ".mp4" for path in (tmp_path / "videos").iterdir())
    env = gymnasium.wrappers.RecordVideo(
        gymnasium.make("peregrine/DroneSwarm-v0", n_drones=1, max_steps=10,
                       render_mode="rgb_array"), str(tmp_path / "single"))
    env.reset(seed=0)
    for _ in range(10):
        env.step(np.zeros(3, np.float32))
    env.close()
    assert any(path.suffix == ".mp4" for path in (tmp_path / "single").iterdir())


def test_get_attr_set_attr_and_call():
    envs = cartpole_vec(num_envs=3)
    assert envs.get_attr("num_threads") == (1, 1, 1)
    masks = envs.get_attr("masks")
    assert len(masks) == 3 and all(m.shape == () for m in masks)  # per-row buffers row by row
    assert envs.call("reset", seed=0)[0][0].shape == (3, 4)
    envs.set_attr("label", "left")
    assert envs.get_attr("label") == ("left",) * 3
    with pytest.raises(ValueError, match="every row shares"):
        envs.set_attr("label", ["a", "b", "c"])
    with pytest.raises(AttributeError, match="no_such"):
        envs.get_attr("no_such")
    envs.close()


def test_sb3_adapter_attribute_calls_honour_indices():
    pytest.importorskip("stable_baselines3")
    vec_env = pv.sb3_vec_env(pv.make("cartpole", num_envs=3, seed=0))
    assert vec_env.get_attr("num_threads", indices=[0, 2]) == [1, 1]
    assert vec_env.get_attr("render_mode", indices=1) == [None]
    assert len(vec_env.get_attr("rewards", indices=[1, 2])) == 2
    with pytest.raises(IndexError, match="out of range"):
        vec_env.get_attr("num_threads", indices=[3])
    vec_env.set_attr("label", 1)
    assert vec_env.get_attr("label") == [1, 1, 1]
    with pytest.raises(ValueError, match="whole batch"):
        vec_env.set_attr("label", 2, indices=[0])
    with pytest.raises(ValueError, match="whole batch"):
        vec_env.env_method("reset", indices=[1])
    assert len(vec_env.env_method("episode_stats")) == 3
    vec_env.close()
    vec_env = pv.sb3_vec_env(peregrine.make("drone_swarm", num_envs=2, n_drones=2, seed=0),
                             render_mode="rgb_array")
    vec_env.reset()
    image = vec_env.render()  # SB3 tiles one frame per row
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    vec_env.close()


# ---- the native batch underneath: held steps and partial resets ------------------------------------

def _states(env):
    return np.array([env.get_state(i) for i in range(env.num_envs)])


def _sample_actions(env, rng):
    space = env.single_action_space
    if isinstance(space, gymnasium.spaces.Box):
        return rng.uniform(-1, 1, env.actions.shape).astype(np.float32)
    high = space.n if isinstance(space, gymnasium.spaces.Discrete) else space.nvec
    return rng.integers(0, high, env.actions.shape).astype(np.int32)


@pytest.mark.parametrize("name", sorted(GYMNASIUM_IDS))
def test_held_instances_are_not_stepped_and_masked_resets_touch_only_the_mask(name):
    held_env = peregrine.make(name, num_envs=40, seed=3, num_threads=2)
    free_env = peregrine.make(name, num_envs=40, seed=3, num_threads=2)
    rng = np.random.default_rng(0)
    hold = rng.random(40) < 0.3
    rows = np.repeat(hold, held_env.agents_per_env)
    for _ in range(3):
        actions = _sample_actions(held_env, rng)
        before = _states(held_env), held_env.observations.copy()
        held_env.step(actions, hold=hold)
        free_env.step(actions)
        after = _states(held_env)
        np.testing.assert_array_equal(after[hold], before[0][hold])
        np.testing.assert_array_equal(held_env.observations[rows], before[1][rows])
        assert not held_env.rewards[rows].any() and not held_env.terminals[rows].any()
        assert not held_env.truncations[rows].any()
        # the others stepped exactly as in a batch that holds nothing
        np.testing.assert_array_equal(after[~hold], _states(free_env)[~hold])
    mask = np.zeros(40, bool)
    mask[[1, 7]] = True
    before = _states(held_env)
    seeds = [None] * 40
    seeds[7] = 11
    held_env.reset_instances(mask, seeds=seeds)
    after = _states(held_env)
    np.testing.assert_array_equal(after[~mask], before[~mask])
    one = peregrine.make(name, num_envs=1, seed=11)
    np.testing.assert_array_equal(after[7], one.get_state(0))
    with pytest.raises(ValueError, match="hold must be a NumPy bool array of shape \\(40,\\)"):
        held_env.step(actions, hold=np.zeros(39, bool))
    with pytest.raises(ValueError, match="mask must be a NumPy bool array"):
        held_env.reset_instances(np.zeros(40, np.int32))
    with pytest.raises(ValueError, match="seeds must hold one entry per instance"):
        held_env.reset_instances(mask, seeds=[1])
    for env in (held_env, free_env, one):
        env.close()


def test_make_names_the_keywords_a_single_env_does_not_take():
    """num_envs and seed given to gymnasium.make clashed with the env's own arguments
    ("got multiple values for keyword argument 'num_envs'")."""
    with pytest.raises(ValueError, match=r"gymnasium.make_vec\(id, num_envs=N\)"):
        gymnasium.make("peregrine/CartPole-v1", num_envs=4)
    with pytest.raises(ValueError, match=r"reset\(seed=S\)"):
        gymnasium.make("peregrine/CartPole-v1", seed=4)
