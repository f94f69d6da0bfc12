"""Adversarial inputs for every registered native env; run under ASan/UBSan by
test_sanitizers.py (it also runs fine without sanitizers).

For each env: every preset, and every config field at its minimum and at its
maximum, on the default config and, where the env names one (`fuzz_preset`),
on that preset too (configs that the Python checks refuse are skipped:
refusing is the right answer),
random and hostile actions (NaN, inf, 1e30, denormals, out-of-range integers
straight into the C binding) with random held instances and masked resets,
and abuse of the binding's own API.
"""
import sys

import numpy as np

import peregrine
from peregrine.envs.registry import env_class

HOSTILE_FLOATS = [np.nan, np.inf, -np.inf, 1e30, -1e30, 1e-45, -0.0, 3.4e38]


def hostile_actions(env, rng, step):
    if env.actions.dtype == np.float32:
        choice = rng.choice(HOSTILE_FLOATS, size=env.actions.shape).astype(np.float32)
        random = rng.uniform(-2, 2, env.actions.shape).astype(np.float32)
        return np.where(rng.random(env.actions.shape) < 0.3, choice, random).astype(np.float32)
    env.action_space.seed(step)
    return np.ascontiguousarray(env.action_space.sample())


def fuzz_config(name, config, rng, steps=40):
    try:
        env = peregrine.make(name, num_envs=5, seed=int(rng.integers(1 << 30)), num_threads=2, **config)
    except ValueError:
        return 0
    with env:
        if env.state_dim and rng.random() < 0.5:   # the global state's writes too
            env.enable_states()
        for step in range(steps):
            hold = rng.random(env.num_envs) < 0.3 if step % 2 else None
            obs, rewards, terminals, truncations, _ = env.step(hostile_actions(env, rng, step),
                                                               hold=hold)
            if step % 7 == 3:
                env.reset_instances(rng.random(env.num_envs) < 0.5,
                                    seeds=[int(s) for s in rng.integers(0, 1 << 62, env.num_envs)])
            if env.observations.dtype == np.float32:
                assert np.isfinite(obs).all(), (name, config, "non-finite observation")
            assert np.isfinite(rewards).all(), (name, config, "non-finite reward")
            if env.states is not None:
                assert (np.abs(env.states) <= 1).all(), (name, config, "state out of [-1, 1]")
        env.episode_stats()
        if env.actions.dtype == np.int32:  # the C binding itself must refuse these
            for bad in (-1, 2**31 - 1, -2**31):
                actions = np.full(env.actions.shape, bad, np.int32)
                try:
                    env._batch.step(actions)
                except ValueError:
                    pass
                else:
                    raise AssertionError(f"{name}: C accepted action {bad}")
    return 1


def fuzz_binding(name):
    env = peregrine.make(name, num_envs=3, seed=0)
    batch = env._batch
    for instance in (-1, 3, 1 << 30):
        try:
            batch.get_state(instance)
        except IndexError:
            pass
        else:
            raise AssertionError("get_state accepted a bad instance")
    state = list(batch.get_state(0))
    for poison in (float("nan"), float("inf"), 1e300, -1e300):
        try:
            batch.set_state(0, [poison] * len(state))
        except ValueError:
            pass
    try:
        batch.set_state(0, state[:-1])
    except ValueError:
        pass
    batch.set_state(0, state)
    misaligned = np.zeros(env.actions.nbytes + 1, np.uint8)[1:].view(env.actions.dtype)
    for wrong in (np.zeros(1, np.float32), np.zeros(10**6, np.int8), b"abc", misaligned):
        try:
            batch.step(wrong)
        except ValueError:
            pass
        else:
            raise AssertionError("step accepted a wrong-sized or misaligned buffer")
    for wrong in (np.zeros(2, np.uint8), np.zeros(10**6, np.uint8), np.zeros(3, np.float32),
                  b"ab", np.zeros(6, np.uint8)[::2]):
        for call in (lambda: batch.step(env.actions, wrong), lambda: batch.reset(wrong)):
            try:
                call()
            except ValueError:
                pass
            else:
                raise AssertionError("hold/mask accepted a wrong buffer")
    for instance in (-1, 3):
        try:
            batch.seed_instance(instance, 1)
        except IndexError:
            pass
        else:
            raise AssertionError("seed_instance accepted a bad instance")
    for seed in (-1, 1 << 64, 1.5, "1"):
        for call in (lambda: batch.seed(seed), lambda: batch.seed_instance(0, seed)):
            try:
                call()
            except ValueError:
                pass
            else:
                raise AssertionError(f"seed accepted {seed!r}")
    for wrong in (np.zeros(1, np.uint64), np.zeros(2, np.int64)[:1], np.zeros(2, np.float64),
                  np.zeros(4, np.uint32), b"0123456789abcdef", np.zeros(3, np.uint64)):
        try:
            batch.repair_actions(wrong)
        except ValueError:
            pass
        else:
            raise AssertionError("repair_actions accepted a wrong errors buffer")
    errors = np.zeros(2, np.uint64)
    hostile = np.full(env.actions.shape, -7 if env.actions.dtype == np.int32 else np.nan,
                      env.actions.dtype)
    env.actions[...] = hostile
    batch.repair_actions(errors)     # repairs in place: the step then accepts them
    batch.step()
    if not errors.any():
        raise AssertionError("repair_actions counted nothing")
    layout = batch.layout()
    if layout["size"] <= 0 or not layout["allocations"]:
        raise AssertionError(f"layout describes no Env: {layout}")
    env.close()
    try:
        batch.step()
    except RuntimeError:
        pass
    else:
        raise AssertionError("step after close did not raise")


def main(names):
    rng = np.random.default_rng(0)
    for name in names:
        cls = env_class(name)
        fields = cls.config_fields()
        configs = [{"preset": preset} for preset in cls.presets]
        bases = [{}] + ([{"preset": cls.fuzz_preset}] if getattr(cls, "fuzz_preset", None) else [])
        for base in bases:
            for field, _default, low, high, is_integer in fields:
                configs += [{**base, field: low}, {**base, field: high}]
        ran = sum(fuzz_config(name, config, rng) for config in configs)
        fuzz_binding(name)
        print(f"{name}: {ran}/{len(configs)} configs fuzzed", flush=True)


if __name__ == "__main__":
    # The shipped envs: a plugin another test installs for a moment (the scaffold's,
    # tests/test_c_envs.py) may be listed and not be importable here.
    from peregrine.envs.registry import BUILT_IN
    main(sys.argv[1:] or sorted(BUILT_IN))
