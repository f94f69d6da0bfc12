"""The native env contract, checked on every registered env.

Each env added to the registry is covered automatically: the rules of the public
checker `peregrine.envs.check_env` (spaces and buffers, in-place steps, seeding and
determinism across thread counts, bad and non-finite actions, statistics, state;
the test at the end also shows it catching broken envs), and here besides:
caller-owned buffers, construction arguments, lifetime (close, exit, fork) and
threads.
"""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import peregrine
from peregrine.envs.native.batch import BUFFER_NAMES

ENVS = peregrine.list_envs()
SMALL = 37  # deliberately not a multiple of the 16-instance thread blocks


def sample_actions(env, count, seed=0):
    env.action_space.seed(seed)
    return [np.ascontiguousarray(env.action_space.sample()) for _ in range(count)]


def rollout(env, actions):
    trace = []
    for batch in actions:
        obs, rewards, terminals, truncations, _ = env.step(batch)
        trace.append((obs.copy(), rewards.copy(), terminals.copy(), truncations.copy(),
                      env.final_observations.copy()))
    return trace


def assert_same_trace(a, b):
    assert len(a) == len(b)
    for step_a, step_b in zip(a, b):
        for x, y in zip(step_a, step_b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ENVS)
def test_caller_owned_buffers_are_written_in_place(name):
    probe = peregrine.make(name, num_envs=SMALL, seed=0)
    layout = {n: np.zeros_like(getattr(probe, n)) for n in BUFFER_NAMES}
    expected = rollout(probe, sample_actions(probe, 20))
    probe.close()
    with peregrine.make(name, num_envs=SMALL, seed=0, buffers=layout) as env:
        assert env.observations is layout["observations"]
        got = rollout(env, sample_actions(env, 20))
    assert_same_trace(expected, got)


@pytest.mark.parametrize("name", ENVS)
def test_bad_buffers_are_refused(name):
    probe = peregrine.make(name, num_envs=4, seed=0)
    good = {n: np.zeros_like(getattr(probe, n)) for n in BUFFER_NAMES}
    probe.close()
    with pytest.raises(ValueError, match="missing"):
        peregrine.make(name, num_envs=4, buffers={"observations": good["observations"]})
    wrong_dtype = dict(good, rewards=good["rewards"].astype(np.float64))
    with pytest.raises(ValueError, match="rewards"):
        peregrine.make(name, num_envs=4, buffers=wrong_dtype)
    wrong_shape = dict(good, observations=np.zeros((3, *good["observations"].shape[1:]),
                                                   good["observations"].dtype))
    with pytest.raises(ValueError, match="observations"):
        peregrine.make(name, num_envs=4, buffers=wrong_shape)
    strided = np.zeros((good["terminals"].shape[0] * 2,), bool)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        peregrine.make(name, num_envs=4, buffers=dict(good, terminals=strided))


@pytest.mark.parametrize("name", ENVS)
def test_bad_construction_arguments(name):
    cls = type(peregrine.make(name, num_envs=1, seed=0))
    with pytest.raises(ValueError, match="num_envs"):
        peregrine.make(name, num_envs=0)
    with pytest.raises(ValueError, match="num_threads"):
        peregrine.make(name, num_envs=4, num_threads=0)
    with pytest.raises(ValueError, match="seed"):
        peregrine.make(name, num_envs=4, seed=-1)
    with pytest.raises(ValueError, match="unknown config field"):
        peregrine.make(name, num_envs=4, no_such_field=1)
    field, _default, low, high, is_integer = cls.config_fields()[0]
    with pytest.raises(ValueError, match=field):
        peregrine.make(name, num_envs=4, **{field: high * 2 + 1})
    with pytest.raises(ValueError, match=field):
        peregrine.make(name, num_envs=4, **{field: "abc"})
    with pytest.raises(ValueError, match="preset"):
        peregrine.make(name, num_envs=4, preset="no_such_preset")


def test_unknown_env_name_lists_the_available_ones():
    with pytest.raises(ValueError, match="cartpole"):
        peregrine.make("no_such_env")


def test_native_binding_checks_config_itself():
    from peregrine.envs.cartpole import _cartpole
    defaults = [f[1] for f in _cartpole.config_fields()]
    with pytest.raises(ValueError, match="max_steps"):
        _cartpole.describe([0.5] + defaults[1:])
    with pytest.raises(ValueError, match="gravity"):
        _cartpole.describe([defaults[0], float("nan")] + defaults[2:])
    with pytest.raises(ValueError, match="expects"):
        _cartpole.describe(defaults[:-1])


def test_episode_stats_are_empty_until_an_episode_ends():
    with peregrine.make("cartpole", num_envs=4, seed=0) as env:
        stats = env.episode_stats()
        assert stats.count == 0 and stats.mean == {} and stats.std == {}
        env.step(np.ones(4, np.int32))
        assert env.episode_stats().count == 0


def test_close_is_idempotent_and_use_after_close_is_an_error():
    env = peregrine.make("cartpole", num_envs=64, seed=0, num_threads=2)
    env.close()
    env.close()
    with pytest.raises((RuntimeError, AttributeError)):
        env.step(np.zeros(64, np.int32))


def test_concurrent_step_on_one_env_is_refused_or_serialised_never_a_crash():
    env = peregrine.make("cartpole", num_envs=1 << 16, seed=0, num_threads=2)
    actions = np.zeros(1 << 16, np.int32)
    errors = []

    def hammer():
        for _ in range(200):
            try:
                env.step(actions)
            except RuntimeError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert all("another thread" in e for e in errors)
    env.close()


def test_more_threads_than_cores_and_than_blocks():
    actions = [np.random.default_rng(s).integers(0, 2, 20).astype(np.int32) for s in range(50)]
    with peregrine.make("cartpole", num_envs=20, seed=3, num_threads=1) as one:
        expected = rollout(one, actions)
    with peregrine.make("cartpole", num_envs=20, seed=3, num_threads=64) as many:
        assert_same_trace(expected, rollout(many, actions))


RUN = [sys.executable, "-c"]


@pytest.mark.parametrize("script", [
    # exit without closing a threaded env
    "import peregrine, numpy as np\n"
    "e = peregrine.make('cartpole', num_envs=4096, num_threads=4)\n"
    "e.step(np.zeros(4096, np.int32))\n",
    # an exception while a threaded env is alive
    "import peregrine, numpy as np\n"
    "e = peregrine.make('cartpole', num_envs=4096, num_threads=4)\n"
    "e.step(np.zeros(4096, np.int32))\n"
    "raise SystemExit(3)\n",
])
def test_no_hang_on_interpreter_exit(script):
    result = subprocess.run(RUN + [script], timeout=60, capture_output=True)
    assert result.returncode in (0, 3), result.stderr.decode()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_threaded_env_keeps_working_in_a_forked_child():
    script = (
        "import os, numpy as np, peregrine\n"
        "e = peregrine.make('cartpole', num_envs=256, seed=0, num_threads=2)\n"
        "a = np.ones(256, np.int32)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    for _ in range(100): e.step(a)\n"
        "    os._exit(0 if np.isfinite(e.observations).all() else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "raise SystemExit(os.waitstatus_to_exitcode(status))\n"
    )
    result = subprocess.run(RUN + [script], timeout=60, capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


# ---- the contract rules: the public checker -------------------------------------

@pytest.mark.parametrize("name", ENVS)
def test_every_registered_env_meets_the_contract(name):
    """The rules live once, in check_env: spaces and buffers, in-place steps, seeding
    and thread counts, bad and non-finite actions, statistics, state."""
    from peregrine.envs import check_env
    check_env(name)
    with peregrine.make(name, num_envs=SMALL, seed=0, num_threads=2) as env:
        check_env(env)          # a batch object: checks it and its twins
        # beyond the contract, what every native env does: all agents live, no infos
        assert env.num_agents == SMALL * env.agents_per_env
        assert env.masks.all()
        assert env.step(sample_actions(env, 1)[0])[4] == {}


@pytest.mark.parametrize("backend", ["serial", "multiprocessing"])
@pytest.mark.parametrize("name", ["cartpole", "drone_swarm"])
def test_the_vector_backends_meet_the_same_contract(name, backend):
    """A vector backend has the native interface, so check_env holds on it too (a
    strided action array used to be copied by the backends but refused by the native
    batch: now both refuse it, naming contiguity)."""
    import peregrine.vector as pv
    from peregrine.envs import check_env
    with pv.make(name, backend=backend, num_envs=4, num_workers=2, overwork=True,
                 seed=0) as env:
        check_env(env)
        good = sample_actions(env, 1)[0]
        with pytest.raises(ValueError, match="C-contiguous"):
            env.step(np.repeat(good, 2, axis=0)[::2])


def test_public_check_env_names_the_broken_rule():
    from peregrine.envs import EnvContractError, check_env
    from peregrine.envs.cartpole import CartPole
    from peregrine.envs.pendulum import Pendulum

    class Copying(CartPole):          # hands out copies instead of its buffers
        def step(self, actions, hold=None):
            obs, rewards, terminals, truncations, infos = super().step(actions, hold)
            return obs.copy(), rewards, terminals, truncations, infos

    class Unseeded(CartPole):         # reset ignores its seed
        def reset(self, seed=None):
            return super().reset(None)

    class Lenient(CartPole):          # steps with whatever it is given
        def step(self, actions, hold=None):
            actions = np.clip(np.asarray(actions), 0, 1).astype(np.int32).reshape(-1)
            actions = np.resize(actions, self.num_agents)
            return super().step(actions, hold)

    class NaNTorque(Pendulum):        # lets a NaN action through into the observations
        def step(self, actions, hold=None):
            result = super().step(actions, hold)
            if np.isnan(actions).any():
                self.observations[0, 0] = np.nan
            return result

    class Racy(CartPole):             # threads disagree past the first block of instances
        def step(self, actions, hold=None):
            result = super().step(actions, hold)
            if self.num_threads > 1 and self.num_envs > 16:
                self.rewards[16:] += 0.5
            return result

    class OneSeed(CartPole):          # every seed plays seed 0's episodes
        def reset(self, seed=None):
            return super().reset(None if seed is None else 0)

    class Gathering(CartPole):       # quietly copies strided actions instead of refusing
        def step(self, actions, hold=None):
            return super().step(np.ascontiguousarray(actions), hold)

    class Vague(CartPole):            # refuses, but does not say why
        def step(self, actions, hold=None):
            try:
                return super().step(actions, hold)
            except ValueError:
                raise ValueError("bad actions") from None

    cases = [(Copying, "own buffers"), (Unseeded, "restart the random streams"),
             (Lenient, "must refuse"), (NaNTorque, "continuous actions of nan"),
             (Racy, "any num_threads"), (OneSeed, "another seed"),
             (Gathering, "must refuse a strided array"), (Vague, "must name the problem")]
    for cls, rule in cases:
        env = cls(num_envs=4, seed=0)
        with pytest.raises(EnvContractError, match=rule):
            check_env(env)
        env.close()
