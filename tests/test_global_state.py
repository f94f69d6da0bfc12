"""The global state in the env contract (DroneSwarm's): written only when enabled,
bounded, rewritten by set_state, the same for every thread count and on the
device batch, refused where an env has none, compiled for the GPU, and served
by the PettingZoo env's state(). Parity with the NumPy reference, step by step
and at episode ends, is in test_drone_swarm.py (run_parity, every config)."""
import importlib.util

import numpy as np
import pytest

import peregrine
from peregrine.envs.drone_swarm import DroneSwarm, global_state_dim
from peregrine.envs.drone_swarm.reference import DroneSwarmReference

SMALL = {"n_drones": 3, "n_victims": 4, "max_steps": 40}


def random_actions(rng, rows):
    return rng.uniform(-1, 1, (rows, 3)).astype(np.float32)


def test_states_are_written_only_once_enabled_and_stay_in_the_state_space():
    env = DroneSwarm(num_envs=5, seed=2, preset="wilderness_obstacles_hard")
    assert env.state_dim == global_state_dim(env.config) == 4 + 7 * 10 + 6 * 8 + 5 * 6
    assert env.states is None and env.final_states is None
    assert env.single_state_space.shape == (env.state_dim,)
    assert env.state_space.shape == (5, env.state_dim)
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.step(random_actions(rng, env.num_agents))
    states = env.enable_states()
    assert states is env.states and env.enable_states() is states      # kept on a second call
    ref = DroneSwarmReference(num_envs=5, seed=2, preset="wilderness_obstacles_hard")
    for instance in range(5):   # written at once, from the current (stepped) state
        ref.set_state(0, env.get_state(instance))
        np.testing.assert_array_equal(states[instance], ref.states[0])
    before = states.copy()
    env.step(random_actions(rng, env.num_agents))
    assert not np.array_equal(states, before)
    for _ in range(200):
        env.step(random_actions(rng, env.num_agents))
        assert env.single_state_space.contains(states[0])
        assert states.min() >= -1.0 and states.max() <= 1.0
    env.close()


def test_set_state_rewrites_the_instance_state_and_the_given_buffers_are_used():
    env = DroneSwarm(num_envs=2, seed=0, **SMALL)
    states = np.full((2, env.state_dim), 7.0, np.float32)
    final_states = np.full((2, env.state_dim), 7.0, np.float32)
    assert env.enable_states(states, final_states) is states
    assert (final_states == 0).all() and (states <= 1).all()
    other = DroneSwarm(num_envs=1, seed=99, **SMALL)
    rng = np.random.default_rng(1)
    for _ in range(10):
        other.step(random_actions(rng, other.num_agents))
    other.enable_states()
    env.set_state(1, other.get_state(0))
    np.testing.assert_array_equal(states[1], other.states[0])
    assert not np.array_equal(states[0], states[1])
    env.close()
    other.close()


def test_states_do_not_depend_on_the_thread_count():
    runs = []
    for threads in (1, 3):
        env = DroneSwarm(num_envs=70, seed=5, num_threads=threads, max_steps=30)
        env.enable_states()
        rng = np.random.default_rng(3)
        trace = []
        for _ in range(70):
            env.step(random_actions(rng, env.num_agents))
            trace.append((env.states.copy(), env.final_states.copy()))
        runs.append(trace)
        env.close()
    for (a, fa), (b, fb) in zip(*runs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(fa, fb)


def test_bad_state_requests_are_refused_by_name():
    cartpole = peregrine.make("cartpole", num_envs=2)
    assert cartpole.state_dim == 0 and cartpole.single_state_space is None
    assert cartpole.state_space is None
    with pytest.raises(ValueError, match="cartpole env has no global state"):
        cartpole.enable_states()
    cartpole.close()
    env = DroneSwarm(num_envs=2, **SMALL)
    shape = (2, env.state_dim)
    with pytest.raises(ValueError, match="final_states must be a writeable C-contiguous float32"):
        env.enable_states(np.zeros(shape, np.float32), np.zeros(shape, np.float64))
    with pytest.raises(ValueError, match="states must be .* of shape"):
        env.enable_states(np.zeros((3, env.state_dim), np.float32))
    shared = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        env.enable_states(shared, shared)
    assert env.states is None           # nothing was attached
    env.close()


def test_device_batch_on_the_cpu_writes_the_same_states():
    torch = pytest.importorskip("torch")
    native = DroneSwarm(num_envs=4, seed=3, **SMALL)
    device = peregrine.make("drone_swarm", num_envs=4, seed=3, device="cpu", **SMALL)
    assert device.states is None and device.state_space == native.state_space
    native.enable_states()
    states = device.enable_states()
    assert tuple(states.shape) == (4, native.state_dim)
    rng = np.random.default_rng(0)
    for _ in range(SMALL["max_steps"] + 5):
        actions = random_actions(rng, native.num_agents)
        native.step(actions)
        device.step(torch.from_numpy(actions))
        np.testing.assert_array_equal(states.numpy(), native.states)
        np.testing.assert_array_equal(device.final_states.numpy(), native.final_states)
    native.close()
    device.close()


def _pg_states_body(name):
    from peregrine.envs.gpu import compiler as gpu
    ptx = gpu.compile_env(name, "ptx").decode(errors="replace")
    body = ptx.split(".entry pg_states", 1)[1]
    return body.split(".entry", 1)[0]


def test_the_gpu_build_writes_the_global_state():
    """NVRTC compiles DroneSwarm's env_global_state into the kernels (pg_states is
    the state pass alone): its body is the state's code, against an empty one for
    an env without a global state."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        pytest.skip("NVRTC not installed (the cuda extra: pip install 'peregrine-rl[cuda]')")
    drone_swarm, cartpole = _pg_states_body("drone_swarm"), _pg_states_body("cartpole")
    assert drone_swarm.count("st.global.f32") >= 10 and "st.global" not in cartpole


def test_pettingzoo_state_is_the_normalised_global_state():
    pytest.importorskip("pettingzoo")
    from peregrine.envs import drone_swarm
    env = drone_swarm.parallel_env(**SMALL)
    native = peregrine.make("drone_swarm", num_envs=1, seed=7, **SMALL)
    native.enable_states()
    env.reset(seed=7)
    assert env.state_space.shape == (native.state_dim,)
    np.testing.assert_array_equal(env.state(), native.states[0])
    rng = np.random.default_rng(0)
    while env.agents:
        batch = rng.uniform(-1, 1, native.actions.shape).astype(np.float32)
        env.step({agent: batch[i] for i, agent in enumerate(env.possible_agents)})
        native.step(batch)
        ended = native.truncations.any()
        state = env.state()
        assert state.dtype == np.float32 and env.state_space.contains(state)
        np.testing.assert_array_equal(state, (native.final_states if ended else native.states)[0])
    env.reset(seed=8)
    assert env.state()[0] == 0.0        # a fresh episode's time
    env.close()
    native.close()


def test_copies_and_pickles_keep_the_global_state():
    import copy
    import pickle
    env = DroneSwarm(num_envs=3, seed=4, **SMALL)
    env.enable_states()
    rng = np.random.default_rng(2)
    for _ in range(SMALL["max_steps"] + 3):        # past an episode end: final states too
        env.step(random_actions(rng, env.num_agents))
    for twin in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        np.testing.assert_array_equal(twin.states, env.states)
        np.testing.assert_array_equal(twin.final_states, env.final_states)
        actions = random_actions(rng, env.num_agents)
        twin.step(actions)
        expected = copy.deepcopy(env)
        expected.step(actions)
        np.testing.assert_array_equal(twin.states, expected.states)
        twin.close()
        expected.close()
    plain = copy.deepcopy(DroneSwarm(num_envs=1, **SMALL))
    assert plain.states is None                       # not enabled, not enabled in the copy
    env.close()
