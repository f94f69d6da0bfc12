"""Third-party clients, unchanged, over Peregrine's envs.

Each test runs a real library the way its users do (TorchRL's GymEnv and
check_env_specs, SuperSuit's vector recipe, PettingZoo's test helpers,
Gymnasium's wrappers, checker and renderers) and checks the conventions they
rely on: registration that survives probing, TypeError for unexpected
keywords, environments that copy and pickle, Gymnasium's episode-record
convention, PettingZoo's render_mode / max_cycles / state conventions,
rgb_array frames for every env (their speed: benchmarks/bench_render.py),
Gymnasium's spaces and specs, the first
episode of a seed, the CLI's exit codes and `--nproc auto`.

TorchRL and SuperSuit come with the `conformance` extra
(`pip install 'peregrine-rl[conformance]'`, which CI installs); the tests
that need one skip with that reason where it is missing.
"""
from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest

import peregrine
from peregrine.envs.native.batch import UnknownKeywordError
from peregrine.envs.registry import GYMNASIUM_IDS, GYMNASIUM_STEP_LIMITS

SINGLE_AGENT = ["cartpole", "pendulum", "mountain_car", "mountain_car_continuous", "prospector"]
ALL = SINGLE_AGENT + ["drone_swarm"]
SMALL_SWARM = {"n_drones": 3, "n_victims": 4, "max_steps": 40}


def gym_id(name):
    return f"peregrine/{GYMNASIUM_IDS[name]}"


def needs(module):
    return pytest.importorskip(module, reason=f"{module} comes with the `conformance` extra")


def random_actions(env, rng):
    space = env.single_action_space
    if isinstance(space, gymnasium.spaces.Discrete):
        return rng.integers(0, space.n, env.num_agents).astype(space.dtype)
    return rng.uniform(space.low, space.high, env.actions.shape).astype(space.dtype)


def python(code, timeout=120):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


# ---- 1. registration survives probing and any import order --------------------------------

@pytest.mark.parametrize("order", [
    "import peregrine, importlib.util; importlib.util.find_spec('gymnasium'); import gymnasium",
    "import peregrine, importlib.util; importlib.util.find_spec('gymnasium');"
    " importlib.util.find_spec('gymnasium'); import gymnasium.spaces; import gymnasium",
    "import gymnasium, peregrine",
    "import peregrine, gymnasium",
])
def test_gymnasium_ids_survive_find_spec_probes_and_import_orders(order):
    result = python(f"{order}; env = gymnasium.make('peregrine/CartPole-v1'); "
                    "print(env.reset(seed=0)[0].shape)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(4,)"


def test_torchrl_imported_after_peregrine_finds_the_ids():
    """TorchRL probes find_spec('gymnasium') when it is imported."""
    needs("torchrl")
    result = python("import peregrine\nfrom torchrl.envs import GymEnv\n"
                    "env = GymEnv('peregrine/CartPole-v1'); print(env.batch_size)", timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]


# ---- 2. TypeError for unexpected keywords; TorchRL builds every env -----------------------

def test_unexpected_keyword_is_a_type_error_as_pythons_own():
    for make in (lambda: peregrine.make("cartpole", frameskip=4),
                 lambda: gymnasium.make("peregrine/CartPole-v1", frameskip=4),
                 lambda: gymnasium.make_vec("peregrine/CartPole-v1", num_envs=2, frameskip=4)):
        with pytest.raises(TypeError, match="unexpected keyword argument 'frameskip'"):
            make()
    with pytest.raises(ValueError, match="unknown config field"):   # still a ValueError
        peregrine.make("cartpole", no_such_field=1)
    assert issubclass(UnknownKeywordError, TypeError) and issubclass(UnknownKeywordError,
                                                                      ValueError)


@pytest.mark.parametrize("name", SINGLE_AGENT)
def test_torchrl_gym_env_passes_check_env_specs(name):
    needs("torchrl")
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import check_env_specs
    env = GymEnv(gym_id(name))
    check_env_specs(env, seed=0)
    rollout = env.rollout(20, break_when_any_done=False)   # across episode ends
    assert rollout["next", "observation"].shape == (20, *env.observation_spec["observation"].shape)
    env.close()


def test_torchrl_gym_env_from_pixels():
    needs("torchrl")
    from torchrl.envs import GymEnv
    env = GymEnv("peregrine/CartPole-v1", from_pixels=True, pixels_only=False)
    rollout = env.rollout(3)
    assert rollout["next", "pixels"].shape == (3, 400, 600, 3)
    env.close()


# ---- 3. copies and pickles ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_native_env_copies_and_pickles_carry_the_running_state(name):
    cloudpickle = needs("cloudpickle")
    env = peregrine.make(name, num_envs=3, seed=5)
    rng = np.random.default_rng(0)
    for _ in range(37):
        env.step(random_actions(env, rng))
    copies = [cloudpickle.loads(cloudpickle.dumps(env)), pickle.loads(pickle.dumps(env)),
              copy.copy(env), copy.deepcopy(env)]
    for _ in range(300):   # across episode ends: the random streams are carried too
        actions = random_actions(env, rng)
        expected = [array.copy() for array in env.step(actions)[:4]]
        for other in copies:
            for theirs, ours in zip(other.step(actions)[:4], expected):
                np.testing.assert_array_equal(theirs, ours)
    for other in copies:
        other.close()
    env.step(random_actions(env, rng))   # closing a copy leaves the original open
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        copy.copy(env)


def test_gymnasium_envs_copy_and_pickle_independently():
    cloudpickle = needs("cloudpickle")
    env = gymnasium.make("peregrine/CartPole-v1")
    env.reset(seed=3)
    env.step(0)
    # (copy.copy of Gymnasium's wrappers is shallow by their design; of the env itself, not)
    copies = [copy.copy(env.unwrapped), copy.deepcopy(env), cloudpickle.loads(cloudpickle.dumps(env))]
    expected = env.step(1)[0]
    for other in copies:
        np.testing.assert_array_equal(other.step(1)[0], expected)
        other.close()
    env.step(1)
    env.close()
    vector = gymnasium.make_vec("peregrine/Pendulum-v1", num_envs=4)
    vector.reset(seed=0)
    clone = cloudpickle.loads(cloudpickle.dumps(vector))
    actions = np.full((4, 1), 0.5, np.float32)
    np.testing.assert_array_equal(clone.step(actions)[0], vector.step(actions)[0])
    shallow = copy.copy(vector)
    shallow.close()
    vector.step(actions)
    vector.close()
    clone.close()


def test_supersuit_vector_recipe_over_the_pettingzoo_env():
    needs("pettingzoo")
    supersuit = needs("supersuit")
    from peregrine.envs import drone_swarm
    vec = supersuit.pettingzoo_env_to_vec_env_v1(drone_swarm.parallel_env(**SMALL_SWARM))
    envs = supersuit.concat_vec_envs_v1(vec, 2, num_cpus=0, base_class="gymnasium")
    observations, _ = envs.reset(seed=1)
    assert observations.shape == (2 * SMALL_SWARM["n_drones"], 19)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(SMALL_SWARM["max_steps"] + 5):
        actions = rng.uniform(-1, 1, (2 * SMALL_SWARM["n_drones"], 3)).astype(np.float32)
        observations, rewards, terminations, truncations, _ = envs.step(actions)
        ended += int(np.sum(terminations | truncations))
    assert ended == 2 * SMALL_SWARM["n_drones"]   # every drone of both copies, once
    envs.close()


def test_supersuit_vector_recipe_in_worker_processes():
    """num_cpus > 0 ships the env to each worker process by pickling it."""
    needs("pettingzoo")
    supersuit = needs("supersuit")
    from peregrine.envs import drone_swarm
    vec = supersuit.pettingzoo_env_to_vec_env_v1(drone_swarm.parallel_env(**SMALL_SWARM))
    envs = supersuit.concat_vec_envs_v1(vec, 2, num_cpus=2, base_class="gymnasium")
    try:
        observations, _ = envs.reset(seed=1)
        assert observations.shape == (6, 19)
        observations, *_ = envs.step(np.zeros((6, 3), np.float32))
        assert np.isfinite(observations).all()
    finally:
        envs.close()


# ---- 4. Gymnasium's episode-record convention --------------------------------------------------

def test_record_episode_statistics_wraps_make_vec_by_default():
    from gymnasium.wrappers.vector import RecordEpisodeStatistics
    envs = RecordEpisodeStatistics(gymnasium.make_vec("peregrine/CartPole-v1", num_envs=4))
    envs.reset(seed=1)
    rng, returns = np.random.default_rng(0), []
    for _ in range(200):
        *_, infos = envs.step(rng.integers(0, 2, 4))
        if "episode" in infos:
            returns += list(infos["episode"]["r"][infos["_episode"]])
    assert len(returns) > 20 and all(1 <= r < 200 for r in returns)
    assert len(envs.return_queue) == len(returns)
    envs.close()
    # the built-in records stay available as an opt-in
    envs = gymnasium.make_vec("peregrine/CartPole-v1", num_envs=2,
                              record_episode_statistics=True)
    envs.reset(seed=0)
    seen = False
    for _ in range(100):
        *_, infos = envs.step(np.zeros(2, np.int64))
        seen |= "episode" in infos and "episode_length" in infos["episode"]
    assert seen
    envs.close()


def test_cleanrl_style_sync_vector_env_logs_episodes_without_final_info():
    """CleanRL's ppo.py shape: a SyncVectorEnv of gymnasium.make thunks, each
    with RecordEpisodeStatistics, built from an id alone ("module:id" imports
    peregrine). Under Gymnasium 1.x the records arrive as infos["episode"] with
    the mask infos["_episode"]; there is no infos["final_info"] (Gymnasium
    0.29's convention, which CleanRL's master branch reads)."""
    env_id = "peregrine:peregrine/CartPole-v1"

    def thunk():
        return gymnasium.wrappers.RecordEpisodeStatistics(gymnasium.make(env_id))

    envs = gymnasium.vector.SyncVectorEnv([thunk for _ in range(4)])
    envs.reset(seed=1)
    rng, lengths, final_info = np.random.default_rng(0), [], False
    for _ in range(150):
        *_, infos = envs.step(rng.integers(0, 2, 4))
        final_info |= "final_info" in infos
        if "episode" in infos:
            lengths += list(infos["episode"]["l"][infos["_episode"]])
    assert len(lengths) > 10 and not final_info
    envs.close()


# ---- 5. PettingZoo's conventions ------------------------------------------------------------

def test_pettingzoo_render_max_cycles_api_and_seed_tests():
    needs("pettingzoo")
    from pettingzoo.test import (max_cycles_test, parallel_api_test, parallel_seed_test,
                                 render_test)
    from peregrine.envs import drone_swarm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # matplotlib: no display here, nothing to show
        render_test(lambda render_mode=None: drone_swarm.env(render_mode=render_mode,
                                                             render_size=64, **SMALL_SWARM))
    max_cycles_test(drone_swarm)
    parallel_api_test(drone_swarm.parallel_env(**SMALL_SWARM), num_cycles=100)
    parallel_seed_test(lambda: drone_swarm.parallel_env(**SMALL_SWARM))


def test_pettingzoo_state_is_bounded_and_in_its_space():
    needs("pettingzoo")
    from peregrine.envs import drone_swarm
    env = drone_swarm.parallel_env(**SMALL_SWARM)
    env.reset(seed=0)
    state = env.state()
    assert state in env.state_space and state.dtype == np.float32
    assert state[0] == 0.0          # the env's global state: its first entry is step / max_steps
    steps = 0
    while env.agents:
        env.step({a: np.ones(3, np.float32) for a in env.agents})
        steps += 1
        assert env.state() in env.state_space
    # after the last step, the state the episode ended on (not the next episode's)
    assert env.state()[0] == np.float32(steps) / np.float32(env.config["max_steps"]) > 0
    with pytest.raises(ValueError, match="max_cycles"):
        drone_swarm.parallel_env(max_cycles=5, max_steps=5)
    env.close()


# ---- 6. rgb_array frames for every env ------------------------------------------------------------

@pytest.mark.parametrize("name", SINGLE_AGENT)
def test_every_env_renders_and_passes_gymnasium_check_env_with_render_checks(name):
    from gymnasium.utils.env_checker import check_env
    env = gymnasium.make(gym_id(name), render_mode="rgb_array")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # unbounded Box / asymmetric Box advice
        check_env(env.unwrapped)
    env.reset(seed=0)
    first = env.render()
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[2] == 3
    frames = [first]
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step(env.action_space.sample() if name != "prospector" else rng.integers(0, 69))
        frames.append(env.render())
    assert any(not np.array_equal(first, frame) for frame in frames)   # it moves
    assert env.metadata["render_fps"] >= 15
    env.close()


def test_record_video_over_make_vec_of_every_single_agent_env(tmp_path):
    needs("moviepy")
    from gymnasium.wrappers.vector import RecordVideo
    for name in SINGLE_AGENT:
        folder = tmp_path / name
        envs = RecordVideo(gymnasium.make_vec(gym_id(name), num_envs=2, max_steps=8,
                                              render_mode="rgb_array"), str(folder),
                           episode_trigger=lambda episode: episode == 0)
        envs.reset(seed=0)
        for _ in range(9):
            envs.step(envs.action_space.sample())
        envs.close()
        assert any(path.suffix == ".mp4" for path in folder.iterdir()), name


def test_drone_swarm_vector_frames_differ_per_drone():
    envs = gymnasium.make_vec("peregrine/DroneSwarm-v0", num_envs=2, n_drones=3,
                              render_mode="rgb_array")
    envs.reset(seed=0)
    frames = envs.render()
    assert len(frames) == 6   # Gymnasium's contract: one frame per sub-env
    for i in range(6):
        for j in range(i + 1, 6):
            assert not np.array_equal(frames[i], frames[j]), (i, j)
    # the drones of one instance see one world: they differ only where a drone is ringed
    changed = np.any(frames[0] != frames[1], axis=2).mean()
    assert 0 < changed < 0.02
    envs.close()


# ---- 7. spaces and specs equal to Gymnasium's ------------------------------------------------

@pytest.mark.parametrize("name", sorted(GYMNASIUM_STEP_LIMITS))
def test_spaces_and_specs_equal_gymnasiums(name):
    ours = gymnasium.make(gym_id(name))
    theirs = gymnasium.make(GYMNASIUM_IDS[name])
    assert ours.observation_space == theirs.observation_space
    assert ours.observation_space.is_bounded() == theirs.observation_space.is_bounded()
    assert ours.spec.max_episode_steps == theirs.spec.max_episode_steps \
        == GYMNASIUM_STEP_LIMITS[name]
    assert gymnasium.spec(gym_id(name)).max_episode_steps == GYMNASIUM_STEP_LIMITS[name]
    ours.close()
    theirs.close()


def test_max_episode_steps_means_what_it_means_for_gymnasiums_envs():
    limit = GYMNASIUM_STEP_LIMITS["pendulum"]   # Pendulum never terminates
    for steps, kwargs in ((limit, {}), (limit + 50, {"max_episode_steps": limit + 50}),
                          (7, {"max_steps": 7})):
        env = gymnasium.make("peregrine/Pendulum-v1", **kwargs)
        env.reset(seed=0)
        for step in range(1, steps + 1):
            *_, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
            assert truncated == (step == steps) and not terminated, (kwargs, step)
        env.close()
    envs = gymnasium.make_vec("peregrine/Pendulum-v1", num_envs=2)
    assert envs.env.config["max_steps"] == limit
    envs.close()
    envs = gymnasium.make_vec("peregrine/Pendulum-v1", num_envs=2, max_steps=9)
    assert envs.env.config["max_steps"] == 9
    envs.close()


# ---- 8. make(seed=s) then reset() plays seed s's first episode ---------------------------------

@pytest.mark.parametrize("name", ALL)
def test_make_with_a_seed_then_reset_starts_that_seeds_first_episode(name):
    made = peregrine.make(name, num_envs=3, seed=11)
    first = made.observations.copy()
    made.reset()
    other = peregrine.make(name, num_envs=3, seed=0)
    other.reset(seed=11)
    np.testing.assert_array_equal(made.observations, first)
    np.testing.assert_array_equal(made.observations, other.observations)
    vector = gymnasium.make_vec(gym_id(name), num_envs=3, seed=11)
    np.testing.assert_array_equal(vector.reset()[0], first)
    # once it has stepped, reset() without a seed continues the streams
    rng = np.random.default_rng(0)
    made.step(random_actions(made, rng))
    made.reset()
    assert not np.array_equal(made.observations, first)
    for env in (made, other, vector):
        env.close()


def test_device_batches_start_the_seeds_first_episode_too():
    torch = pytest.importorskip("torch")
    made = peregrine.make("pendulum", num_envs=3, seed=11, device="cpu")
    first = made.observations.clone()
    made.reset()
    torch.testing.assert_close(made.observations, first, rtol=0, atol=0)
    native = peregrine.make("pendulum", num_envs=3, seed=11)
    np.testing.assert_array_equal(made.observations.numpy(), native.observations)
    made.step(torch.zeros_like(made.actions))
    made.reset()
    assert not torch.equal(made.observations, first)
    made.close()
    native.close()


# ---- 9. the CLI -----------------------------------------------------------------------------

def test_peregrine_without_a_command_is_a_usage_error():
    result = subprocess.run([sys.executable, "-m", "peregrine"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "usage: peregrine" in result.stderr and "train" in result.stderr


def test_drone_swarm_sync_mode_message_names_what_to_do():
    with pytest.raises(ValueError) as error:
        gymnasium.make_vec("peregrine/DroneSwarm-v0", num_envs=2, vectorization_mode="sync")
    message = str(error.value)
    assert "default vectorization mode" in message and "parallel_env" in message


# ---- 10. --nproc auto -----------------------------------------------------------------------

def test_nproc_auto_splits_the_one_process_batch_over_the_cores():
    pytest.importorskip("torch")
    from peregrine.train.config import load_config
    from peregrine.train.distributed import auto_ranks
    config = load_config("drone_swarm", None, [])
    ranks, overrides, why = auto_ranks(config, cores=2)
    assert ranks == 2 and "2 ranks" in why
    assert dict(overrides) == {"vec.num_envs": config.vec.num_envs // 2,
                               "train.minibatch_size": config.train.minibatch_size // 2,
                               "vec.num_threads": 1, "train.torch_threads": 1}
    # the global batch is the one-process batch
    assert dict(overrides)["vec.num_envs"] * ranks == config.vec.num_envs
    assert auto_ranks(config, cores=1)[0] == 1
    assert auto_ranks(config, cores=3)[0] == 2   # 128 envs: 3 does not divide, 2 does
    # a feature that cannot run on several ranks: one process, saying why
    ranks, overrides, why = auto_ranks(load_config("cartpole", None, [("vec.split", 2)]),
                                       cores=2)
    assert ranks == 1 and overrides == [] and "vec.split" in why


@pytest.mark.slow
def test_nproc_auto_trains_with_one_rank_per_core_and_the_same_global_batch(tmp_path):
    pytest.importorskip("torch")
    import json

    from peregrine.train.config import load_config
    from peregrine.train.distributed import auto_ranks, available_cores
    config = load_config("cartpole", None, [])
    ranks, overrides, _ = auto_ranks(config, available_cores())
    run_dir = tmp_path / "run"
    job = subprocess.run(
        [sys.executable, "-m", "peregrine", "train", "cartpole", "--nproc", "auto", "--detach",
         "--train.tensorboard", "false", "--run-dir", str(run_dir), "--total-steps", "4096",
         "--train.stop-return", "0"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    assert f"--nproc auto: {ranks} rank" in job.stdout or ranks == 1
    updates = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()
               if '"updates"' in line]
    assert updates[-1].get("world_size", 1) == ranks
    saved = (run_dir / "config.toml").read_text()
    assert f"num_envs = {config.vec.num_envs // ranks}\n" in saved
    assert f"minibatch_size = {config.train.minibatch_size // ranks}\n" in saved
