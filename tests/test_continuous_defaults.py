"""The continuous-action defaults (config.CONTINUOUS_DEFAULTS): which runs start from
them, what still wins over them, and how a run says so."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from peregrine.cli import main
from peregrine.train.config import CONTINUOUS_DEFAULTS, TrainConfig, load_config
from peregrine.vector.emulation import single_spaces


class Reach(gym.Env):
    """One step to a target: continuous actions, or a Discrete(3) with `continuous=False`."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, continuous: bool = True):
        self.action_space = (spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous
                             else spaces.Discrete(3))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


def reach(continuous: bool = True):
    return Reach(continuous)


def broken():
    raise RuntimeError("this env cannot be made")


def overlaid(config) -> dict:
    return {key: getattr(config.train, key) for key in CONTINUOUS_DEFAULTS["train"]}


def test_a_box_action_env_starts_from_the_continuous_defaults():
    config = load_config("gym:Pendulum-v1")
    assert config.defaults == "continuous"
    assert overlaid(config) == CONTINUOUS_DEFAULTS["train"]
    assert config.train.gamma == TrainConfig().gamma     # what they do not name stays


def test_a_discrete_env_keeps_the_dataclass_defaults():
    config = load_config("gym:CartPole-v1")
    assert config.defaults == "" and config.train == TrainConfig()


def test_the_env_keywords_decide_the_action_space():
    assert load_config(reach).defaults == "continuous"
    discrete = load_config(reach, overrides=[("env.continuous", False)])
    assert discrete.defaults == "" and discrete.train == TrainConfig()


def test_files_and_overrides_still_win(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text("[train]\nlearning_rate = 1e-3\n")
    config = load_config(reach, mine, ["--train.ent-coef", "0.005"])
    assert (config.train.learning_rate, config.train.ent_coef) == (1e-3, 0.005)
    assert config.train.update_epochs == CONTINUOUS_DEFAULTS["train"]["update_epochs"]


def test_an_env_is_made_only_where_the_defaults_would_change_something():
    made = []

    def counted():
        made.append(1)
        return Reach()
    assert load_config(counted).defaults == "continuous" and len(made) == 1
    dataclass_defaults = TrainConfig()
    config = load_config(counted, overrides=[(f"train.{key}", getattr(dataclass_defaults, key))
                                             for key in CONTINUOUS_DEFAULTS["train"]])
    assert config.defaults == "" and config.train == TrainConfig() and len(made) == 1


def test_a_shipped_config_is_not_overlaid():
    """The native pendulum acts in a Box too; its shipped file is its whole start."""
    config = load_config("pendulum")
    assert config.defaults == "" and config.train.normalize_obs is False


def test_a_resume_keeps_the_recorded_values():
    recorded = load_config(reach, overrides=[("train.ent_coef", 0.01)]).to_dict()
    recorded["train"]["update_epochs"] = 4      # a run recorded before these defaults
    resumed = load_config(reach, base=recorded)
    assert (resumed.train.ent_coef, resumed.train.update_epochs) == (0.01, 4)


def test_an_env_that_cannot_be_made_is_left_to_the_trainer():
    config = load_config(broken)
    assert config.defaults == "" and config.train == TrainConfig()


def test_single_spaces_of_every_kind_of_env():
    from any_env_toys import cartpole_native_batch, cartpole_vector_env, tag_parallel_env
    assert single_spaces(Reach()) == (Reach.observation_space, Reach().action_space)
    tag = tag_parallel_env()
    assert single_spaces(tag) == (tag.observation_space(tag.possible_agents[0]),
                                  spaces.Discrete(2))
    vector, native = cartpole_vector_env(2), cartpole_native_batch(2)
    try:
        assert single_spaces(vector) == (vector.single_observation_space, spaces.Discrete(2))
        assert single_spaces(native) == (native.single_observation_space,
                                         native.single_action_space)
    finally:
        vector.close()
        native.close()


class Steer(Reach):
    """Reach with a camera: an (H, W, C) uint8 image that the policy encodes (a CNN)."""

    observation_space = spaces.Box(0, 255, (36, 36, 3), np.uint8)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((36, 36, 3), np.uint8), {}

    def step(self, action):
        return np.zeros((36, 36, 3), np.uint8), 0.0, True, False, {}


def steer():
    return Steer()


class GoalReach(Reach):
    """Reach with a Dict observation of real-valued leaves (a goal env's layout)."""

    observation_space = spaces.Dict({"position": spaces.Box(-1.0, 1.0, (2,), np.float32),
                                     "goal": spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def _observe(self):
        return {"position": np.full(2, 0.5, np.float32), "goal": np.full(2, -3e-3, np.float32)}

    def step(self, action):
        return self._observe(), 0.0, True, False, {}


def goal_reach():
    return GoalReach()


def test_a_dict_of_real_values_is_standardised_like_flat_rows():
    """A Dict of Box leaves passes through its encoder unchanged, so normalize_obs
    applies to it (it was refused with every Dict); a Dict with a discrete leaf is
    still refused, naming the way out."""
    import pytest

    from peregrine.train.ppo import Trainer
    config = load_config(goal_reach, overrides=[("vec.backend", "serial"),
                                                ("vec.num_envs", 2)])
    assert overlaid(config) == CONTINUOUS_DEFAULTS["train"]
    trainer = Trainer(config)
    try:
        assert trainer.policy.observation_encoder is not None
        assert trainer.pipeline.obs_norm is not None
        trainer.update()
        assert trainer.pipeline.obs_norm.stats.count > 0
    finally:
        trainer.close()
    from any_env_toys import dict_env
    refused = load_config(dict_env, overrides=[("vec.backend", "serial"),
                                               ("train.normalize_obs", True)])
    with pytest.raises(ValueError, match="images, uint8 or discrete values that the policy "
                                         "encodes .*NormalizeObservation"):
        Trainer(refused)


def test_images_keep_the_rest_but_not_observation_normalisation(tmp_path):
    """train.normalize_obs is refused for rows the policy encodes, so an image env (gym's
    CarRacing) would have failed at its start on the defaults meant to help it."""
    config = load_config(steer)
    assert config.defaults == "continuous" and config.train.normalize_obs is False
    assert {key: value for key, value in overlaid(config).items() if key != "normalize_obs"} \
        == {key: value for key, value in CONTINUOUS_DEFAULTS["train"].items()
            if key != "normalize_obs"}
    flat = load_config(steer, overrides=[("policy.encoder", "flat")])
    assert overlaid(flat) == CONTINUOUS_DEFAULTS["train"]     # flat rows: standardised
    assert main(["train", f"{__name__}:steer", "--total-steps", "128", "--vec.num-envs", "2",
                 "--train.horizon", "64", "--train.update-epochs", "1", "--detach",
                 "--train.tensorboard", "false", "--run-dir", str(tmp_path / "run")]) == 0


def test_the_cli_says_a_run_starts_from_them(tmp_path, capsys):
    assert main(["train", "gym:Pendulum-v1", "--total-steps", "256", "--vec.num-envs", "2",
                 "--train.horizon", "128", "--train.update-epochs", "1", "--detach",
                 "--train.tensorboard", "false", "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "gym:Pendulum-v1 has continuous actions" in out
    assert "train.ent_coef 0.0" in out and "train.update_epochs 1" in out
