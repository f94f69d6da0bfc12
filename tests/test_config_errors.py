"""Training configuration: where the env name comes from, values of the wrong type,
cross-field checks, and configs of envs that are not registered native envs."""
from __future__ import annotations

import math

import re

import pytest

from peregrine.train.config import Config, dump_toml, load_config, read_toml, set_key


def test_the_env_name_can_come_from_the_config_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[env]\nname = "pendulum"\n[vec]\nnum_envs = 3\n')
    config = load_config(None, path)
    assert config.env_name == "pendulum" and config.vec.num_envs == 3
    # ... and the shipped pendulum file is layered under it
    assert config.train.total_steps == load_config("pendulum").train.total_steps


def test_the_env_name_can_come_from_the_base_config():
    base = load_config("mountain_car", overrides=[("train.seed", 7)]).to_dict()
    config = load_config(None, base=base)
    assert config.env_name == "mountain_car" and config.train.seed == 7


def test_no_env_at_all_is_refused(tmp_path):
    path = tmp_path / "no_env.toml"
    path.write_text("[vec]\nnum_envs = 3\n")
    with pytest.raises(ValueError, match=r"no env given: pass ENV .* \[env\] name"):
        load_config(None, path)
    with pytest.raises(ValueError, match="no env given"):
        load_config()


def test_a_file_for_another_env_is_refused(tmp_path):
    path = tmp_path / "pendulum.toml"
    path.write_text('[env]\nname = "pendulum"\n')
    with pytest.raises(ValueError, match="sets env.name = 'pendulum', but the env given is "
                                         "'cartpole': .*copy it without its \\[env\\] table"):
        load_config("cartpole", path)
    with pytest.raises(ValueError, match="env.name is 'pendulum' but the env given is 'cartpole'"):
        load_config("cartpole", overrides=[("env.name", "pendulum")])


def test_a_section_that_is_not_a_table_is_refused(tmp_path):
    path = tmp_path / "flat.toml"
    path.write_text("train = 3\n")
    with pytest.raises(ValueError, match=r"config section \[train\] must be a table, got 3"):
        load_config("cartpole", path)


@pytest.mark.parametrize("key, value, message", [
    ("vec.num_envs", True, "vec.num_envs must be an integer, got True"),
    ("vec.num_envs", 2.5, "vec.num_envs must be an integer, got 2.5"),
    ("vec.num_envs", "inf", "vec.num_envs must be an integer"),
    ("train.learning_rate", False, "train.learning_rate must be a number, got False"),
    ("train.learning_rate", "fast", "train.learning_rate must be a number, got 'fast'"),
    ("train.learning_rate", [1e-3], "train.learning_rate must be a number"),
    ("train.gamma", "nan", "train.gamma must be finite, got 'nan'"),
    ("train.clip_coef", "inf", "train.clip_coef must be finite"),
    ("train.run_dir", 5, "train.run_dir must be a string, got 5"),
    ("policy.activation", 1, "policy.activation must be a string"),
    ("env.name", 3, "env.name must be a string, got 3"),
    ("env.preset", ["a"], "env.preset must be a string"),
])
def test_a_value_of_the_wrong_type_names_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        load_config("cartpole", overrides=[(key, value)])


def test_integer_keys_take_integral_floats_and_underscores():
    config = load_config("cartpole", overrides=[("train.total_steps", "1e5"),
                                                ("vec.num_envs", "1_024"), ("train.horizon", 32.0)])
    assert config.train.total_steps == 100_000 and isinstance(config.train.total_steps, int)
    assert config.vec.num_envs == 1024 and config.train.horizon == 32


@pytest.mark.parametrize("overrides, message", [
    ([("train.dist_timeout", 0)], "train.dist_timeout must be > 0, got 0"),
    ([("train.dist_timeout", -5)], "train.dist_timeout must be > 0"),
    ([("train.adam_eps", 0)], "train.adam_eps must be > 0, got 0"),
    ([("policy.lstm", True), ("train.horizon", 24), ("policy.bptt_horizon", 16)],
     r"policy.bptt_horizon \(16\) must divide train.horizon \(24\) when policy.lstm is true"),
    ([("train.torch_threads", 2000)], r"train.torch_threads must be in \[0, 1024\]"),
    ([("train.seed", 2**64)], "train.seed must be less than 2\\*\\*64"),
])
def test_cross_field_checks_name_the_keys(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("cartpole", overrides=overrides)


def test_lstm_with_a_dividing_bptt_horizon_is_accepted():
    config = load_config("cartpole", overrides=[("policy.lstm", True), ("train.horizon", 32),
                                                ("policy.bptt_horizon", 16)])
    assert config.policy.lstm and config.train.horizon % config.policy.bptt_horizon == 0


def test_an_unregistered_env_passes_its_values_through_typed():
    """A gymnasium or user env (not a registered native one) has no field list: its
    [env] values are kept, strings read as numbers where they are numbers."""
    config = load_config("gym:MyGymEnv-v0", overrides=[
        ("env.max_steps", "200"), ("env.scale", "0.5"), ("env.mode", "hard"),
        ("env.layout", [1, 2]), ("env.flags", "[1, 2]"), ("env.on", "true")])
    assert config.env == {"name": "gym:MyGymEnv-v0", "max_steps": 200, "scale": 0.5,
                          "mode": "hard", "layout": [1, 2], "flags": [1, 2], "on": True}
    assert isinstance(config.env["max_steps"], int) and isinstance(config.env["scale"], float)
    # no shipped file for it: the built-in defaults
    assert config.train.total_steps == Config().train.total_steps


def test_env_values_before_the_env_is_named_pass_through():
    """Command-line text is read as a TOML literal; a TOML string stays a string
    (issue 35: no conversion beyond TOML's own types)."""
    config = Config()
    set_key(config, "env.anything", "12", text=True)
    assert config.env == {"anything": 12}
    set_key(config, "env.anything", "12")
    assert config.env == {"anything": "12"}


def test_lists_round_trip_through_toml_and_other_values_are_refused(tmp_path):
    text = dump_toml({"env": {"name": "my_gym_env", "layout": [1, 2.5, "x", True], "empty": []}})
    assert 'layout = [1, 2.5, "x", true]' in text and "empty = []" in text
    path = tmp_path / "config.toml"
    path.write_text(text)
    assert read_toml(path)["env"] == {"name": "my_gym_env", "layout": [1, 2.5, "x", True],
                                      "empty": []}
    # tables (env.wrappers entries) are written inline and read back equal
    wrappers = [{"name": "FrameStackObservation", "stack_size": 4}, "NormalizeObservation"]
    path.write_text(dump_toml({"env": {"name": "gym:X-v0", "wrappers": wrappers,
                                       "odd key": {"a b": 1}}}))
    assert read_toml(path)["env"] == {"name": "gym:X-v0", "wrappers": wrappers,
                                      "odd key": {"a b": 1}}
    with pytest.raises(ValueError, match=r"cannot write \{1, 2\} to TOML"):
        dump_toml({"env": {"set": {1, 2}}})
    with pytest.raises(ValueError, match="cannot write None to TOML"):
        dump_toml({"env": {"nothing": None}})


def test_finite_floats_from_strings_are_accepted():
    config = load_config("cartpole", overrides=[("train.learning_rate", "3e-4"),
                                                ("train.target_kl", "0.02")])
    assert math.isclose(config.train.learning_rate, 3e-4) and config.train.target_kl == 0.02


# ---- the compatibility table ---------------------------------------------------------------

def test_the_compatibility_table_names_only_real_features_and_each_pair_once():
    """A name in INCOMPATIBLE that FEATURES does not define (or a runtime fact) would never
    be present, so its rule would silently never fire; a pair written twice would be
    two places deciding it."""
    from peregrine.train.config import AN_ENV_OBJECT, FEATURES, INCOMPATIBLE, SEVERAL_RANKS
    known = set(FEATURES) | {AN_ENV_OBJECT, SEVERAL_RANKS}
    pairs = set()
    for feature, others, why in INCOMPATIBLE:
        assert feature in known and why
        for other in others:
            assert other in known and other != feature
            pair = frozenset((feature, other))
            assert pair not in pairs, f"{sorted(pair)} is decided twice"
            pairs.add(pair)


@pytest.mark.parametrize("facts, overrides, message", [
    (dict(several_ranks=True), [("vec.split", 2)], "vec.split = 2 does not support several ranks"),
    (dict(env_object=True), [("train.overlap", True)],
     "train.overlap = true does not support an env object"),
    (dict(teacher_object=True), [("train.compile", True)],
     "train.compile = true does not support train.teacher"),
    (dict(), [("policy.critic", "global"), ("vec.backend", "multiprocessing")],
     "policy.critic = 'global' does not support vec.backend = 'multiprocessing'"),
])
def test_facts_outside_the_config_are_checked_by_the_same_table(facts, overrides, message):
    from peregrine.train.config import check_features
    env = "drone_swarm" if any(key == "policy.critic" for key, _ in overrides) else "cartpole"
    if not facts:
        with pytest.raises(ValueError, match=message):
            load_config(env, overrides=overrides)
        return
    config = load_config(env, overrides=overrides)     # the config alone is fine
    check_features(config)
    with pytest.raises(ValueError, match=message):
        check_features(config, **facts)


def test_the_launcher_splits_a_normalised_config_over_ranks():
    """The normalisers' statistics are synchronised once a rollout (normalize.py), so
    several ranks take them; they were refused, and --nproc auto fell back to one."""
    from peregrine.train.distributed import auto_ranks
    ranks, overrides, why = auto_ranks(load_config("cartpole", overrides=[
        ("train.normalize_reward", True), ("train.normalize_obs", True)]), cores=2)
    assert ranks == 2 and dict(overrides)["vec.num_envs"] == 16, why


def test_a_quoted_number_gets_the_fix_and_a_word_does_not(tmp_path):
    path = tmp_path / "quoted.toml"
    path.write_text('[vec]\nnum_envs = "64"\n')
    with pytest.raises(ValueError, match="got '64' .a string: write the value without quotes"):
        load_config("cartpole", path)
    # a bare word on the command line was never quoted: no such advice
    with pytest.raises(ValueError) as caught:
        load_config("cartpole", overrides=[("vec.num_envs", "abc")])
    assert str(caught.value).endswith("vec.num_envs must be an integer, got 'abc'")


def test_a_config_changed_after_load_config_is_checked_again_by_the_trainer():
    """Trainer re-runs load_config's checks: a gamma of 1.5 or no epochs set on the
    object afterwards used to train silently."""
    from peregrine.train.ppo import Trainer
    for key, value, message in (("gamma", 1.5, "train.gamma must be in [0, 1], got 1.5"),
                                ("update_epochs", 0, "train.update_epochs must be >= 1"),
                                ("horizon", "16", "train.horizon must be an integer, got '16'")):
        config = load_config("cartpole", overrides=[("vec.num_envs", 4)])
        setattr(config.train, key, value)
        with pytest.raises(ValueError, match=re.escape(message)):
            Trainer(config)


def test_an_env_factory_set_after_load_config_must_be_the_recorded_env():
    """It trained the factory's env and recorded the loaded name (config.toml, the
    checkpoint), so `peregrine eval --policy RUN` later made the other env."""
    from peregrine.train.ppo import Trainer
    import any_env_toys
    config = load_config("gym:CartPole-v1", overrides=[("vec.num_envs", 2)])
    config.env_factory = any_env_toys.chain_env
    with pytest.raises(ValueError, match="config.env_factory is 'any_env_toys:chain_env' but "
                                         "env.name is 'gym:CartPole-v1'.*load_config"):
        Trainer(config)


def test_a_path_object_is_a_string_key_s_value(tmp_path):
    """config.train.run_dir = Path(...) is what a Python user writes; the trainer's
    check of the config used to refuse it as "must be a string"."""
    from pathlib import Path
    config = load_config("cartpole", overrides=[("train.run_dir", tmp_path / "a")])
    assert config.train.run_dir == str(tmp_path / "a")
    config.train.run_dir = Path(tmp_path / "b")
    set_key(config, "train.run_dir", config.train.run_dir)
    assert config.train.run_dir == str(tmp_path / "b")


@pytest.mark.parametrize("overrides", [{"train.horizon": 3}, "--train.horizon 3", 3,
                                       [("train.horizon",)]])
def test_overrides_of_the_wrong_shape_are_named(overrides):
    with pytest.raises(TypeError, match="override"):
        load_config("cartpole", overrides=overrides)


def test_a_typo_in_a_config_attribute_is_refused():
    """`config.train.learning_rat = 0.1` made a new attribute that nothing read: the run
    trained with the old learning rate and recorded it, without a word."""
    from peregrine.train.config import load_config
    config = load_config("cartpole")
    with pytest.raises(AttributeError, match=r"unknown config key train.learning_rat; valid "
                                             r"keys in \[train\]: \[.*'learning_rate'"):
        config.train.learning_rat = 0.1
    with pytest.raises(AttributeError, match=r"unknown config key vec.num_env;"):
        config.vec.num_env = 4
    config.policy.hidden_size = 32
    assert config.policy.hidden_size == 32
