"""Evaluation runs in the checkpoint's own world unless another one is asked for
(evaluate, `peregrine eval`, `peregrine render`, load_actor/make_trained_env, profile trainer_eval)."""
import json
import warnings
from dataclasses import asdict

import pytest

import peregrine
from peregrine.cli import main
from peregrine.evaluate import eval_world, evaluate

torch = pytest.importorskip("torch")

TRAINED = {"name": "drone_swarm", "preset": "wilderness", "n_drones": 4, "max_steps": 20,
           "r_scan_near": 0.0}


def save_untrained(path, env, trained: dict):
    """An untrained policy for `env`'s spaces saved at `path` as a run whose [env]
    section is `trained`."""
    from peregrine.train.checkpoint import save
    from peregrine.train.config import PolicyConfig
    from peregrine.train.policy import Policy, describe_space
    policy = Policy(env.single_observation_space, env.single_action_space, PolicyConfig())
    save(path, {"policy": policy.state_dict(),
                "config": {"policy": asdict(PolicyConfig()), "env": dict(trained)},
                "observation_space": describe_space(env.single_observation_space),
                "action_space": describe_space(env.single_action_space),
                "env_name": trained["name"]})
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained policy saved as a run trained in a non-default world."""
    with peregrine.make("drone_swarm", num_envs=1, seed=0) as env:
        return str(save_untrained(tmp_path_factory.mktemp("run") / "latest.pt", env, TRAINED))


def test_evaluate_uses_the_checkpoints_world_by_default(checkpoint):
    result = evaluate("drone_swarm", checkpoint, episodes=2, seed=0)
    config = result["env_config"]
    assert config["n_drones"] == 4 and config["max_steps"] == 20 and config["world_size"] == 120.0
    assert config["r_scan_near"] == 0.0                  # the trained rewards too
    assert result["preset"] == "wilderness" and "checkpoint" in result["world"]
    assert result["mean"]["episode_length"] == 20.0


def test_another_world_is_explicit_and_named(checkpoint):
    result = evaluate("drone_swarm", checkpoint, episodes=2, seed=0, preset="default", max_steps=15)
    assert result["env_config"]["n_drones"] == 8 and result["env_config"]["world_size"] == 100.0
    assert result["world"] == "preset default, overridden: max_steps=15"
    # a field override alone keeps the rest of the trained world
    result = evaluate("drone_swarm", checkpoint, episodes=2, seed=0, max_steps=10)
    assert result["env_config"]["n_drones"] == 4 and result["env_config"]["max_steps"] == 10
    assert "checkpoint" in result["world"] and "max_steps=10" in result["world"]


def test_another_preset_keeps_the_checkpoints_observation_fields(tmp_path):
    """obs_report / obs_drone_id belong to the agent: --preset keeps them, so the
    policy still reads the observations (19 + 2 columns), and says so."""
    from peregrine.train.checkpoint import make_trained_env
    trained = {**TRAINED, "obs_report": 1, "obs_drone_id": 1}
    with peregrine.make("drone_swarm", num_envs=1, seed=0, obs_report=1, obs_drone_id=1) as env:
        path = save_untrained(tmp_path / "latest.pt", env, trained)
    result = evaluate("drone_swarm", str(path), episodes=2, seed=0, preset="default", max_steps=5)
    assert result["env_config"]["n_drones"] == 8 and result["env_config"]["obs_report"] == 1
    assert result["world"] == ("preset default with the checkpoint's obs_report=1, "
                               "obs_drone_id=1, overridden: max_steps=5")
    with make_trained_env(str(path), preset="default") as env:
        assert env.obs_dim == 21 and env.config["world_size"] == 100.0
    # an explicit override still wins, and the mismatch is then refused by name
    with pytest.raises(ValueError, match="observation_space"):
        evaluate("drone_swarm", str(path), episodes=1, seed=0, preset="default", obs_drone_id=0)


def test_scripted_policies_default_to_the_default_preset():
    world = eval_world("drone_swarm", "voronoi")
    assert world["kwargs"] == {} and world["description"] == "preset default"
    assert eval_world("cartpole", "random", "default", {"max_steps": 10})["explicit"]


def test_checkpoint_of_another_env_is_refused(checkpoint):
    with pytest.raises(ValueError, match="trained on 'drone_swarm'"):
        evaluate("cartpole", checkpoint, episodes=1)


def test_load_actor_warns_about_another_world_and_make_trained_env_builds_the_trained_one(checkpoint):
    from peregrine.train import load_actor
    from peregrine.train.checkpoint import make_trained_env
    with peregrine.make("drone_swarm", num_envs=1, seed=0) as env:
        with pytest.warns(UserWarning, match="n_drones: trained 4, env 8"):
            load_actor(checkpoint, env)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_actor(checkpoint, env, check_world=False)
    with make_trained_env(checkpoint, num_envs=2, seed=0) as env:
        assert env.config["n_drones"] == 4 and env.config["world_size"] == 120.0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_actor(checkpoint, env)
    with make_trained_env(checkpoint, preset="default", n_victims=3) as env:
        assert env.config["n_drones"] == 8 and env.config["n_victims"] == 3


def test_old_name_make_env_still_builds_the_trained_env_with_a_deprecation_warning(checkpoint):
    from peregrine.train.checkpoint import make_env
    with pytest.warns(DeprecationWarning, match="make_trained_env"):
        env = make_env(checkpoint, num_envs=2, seed=0, n_victims=3)
    with env:
        assert env.num_envs == 2 and env.config["n_drones"] == 4
        assert env.config["n_victims"] == 3


def test_eval_cli_header_and_env_overrides(checkpoint, capsys):
    assert main(["eval", "drone_swarm", "--policy", checkpoint, "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "world: the checkpoint's own (preset wilderness, n_drones=4" in out
    assert main(["eval", "drone_swarm", "--policy", checkpoint, "--episodes", "2", "--json",
                 "--preset", "short_radio", "--env.max-steps", "12", "--env.n_drones=5"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env_config"]["r_comm"] == 10.0 and result["env_config"]["n_drones"] == 5
    assert result["mean"]["episode_length"] == 12.0
    assert result["world"] == "preset short_radio, overridden: max_steps=12, n_drones=5"
    assert main(["eval", "drone_swarm", "--episodes", "1", "--env.n_drone", "3"]) == 2
    assert "n_drone" in capsys.readouterr().err
    assert main(["eval", "drone_swarm", "--episodes", "1", "--train.seed", "3"]) == 2
    assert "only env overrides" in capsys.readouterr().err


def test_render_uses_the_checkpoints_world(checkpoint, tmp_path, capsys):
    out = tmp_path / "run.gif"
    assert main(["render", "drone_swarm", "--policy", checkpoint, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "world: the checkpoint's own (preset wilderness" in printed
    assert "20 steps" in printed                                   # the trained max_steps
    assert main(["render", "drone_swarm", "--policy", checkpoint, "--out", str(out),
                 "--env.max_steps", "7"]) == 0
    assert "7 steps" in capsys.readouterr().out


def test_profile_trainer_eval_evaluates_in_the_trainers_world(tmp_path, capsys):
    code = main(["profile", "drone_swarm", "--mode", "trainer_eval", "--seconds", "0.05",
                 "--warmup", "0", "--num-envs", "2", "--set", "train.horizon=8",
                 "--set", "train.minibatch_size=32", "--set", "env.preset=wilderness",
                 "--set", "env.n_drones=3", "--set", "env.max_steps=12",
                 "--eval-interval", "1", "--eval-episodes", "2", "--no-artifact",
                 "--json", str(tmp_path / "eval.json")])
    assert code == 0, capsys.readouterr()
    setup = json.loads((tmp_path / "eval.json").read_text())["setup"]
    assert setup["eval_env_config"]["n_drones"] == 3 and setup["eval_env_config"]["world_size"] == 120.0
    assert setup["eval_env_config"] == setup["env_config"]


def test_load_actor_names_another_emulated_world(tmp_path):
    """An emulated env's world is its name, keywords and wrappers: a vector env made with
    other keywords than the checkpoint's (same spaces, so nothing else would say so) is
    named; one made by make_trained_env, or from a callable of the user's, is not."""
    import peregrine.vector as pv
    from peregrine.train.checkpoint import load_actor, make_trained_env
    trained = {"name": "gym:CartPole-v1", "max_episode_steps": 50,
               "wrappers": ["NormalizeObservation"]}
    with pv.make("gym:CartPole-v1", num_envs=1, backend="serial") as env:
        path = save_untrained(tmp_path / "latest.pt", env, trained)
        with pytest.warns(UserWarning, match=r"max_episode_steps: trained 50, env None, "
                                             r"wrappers: trained \['NormalizeObservation'\]"):
            load_actor(path, env)
    with pv.make("gym:CartPole-v1", num_envs=1, backend="serial", max_episode_steps=60,
                 wrappers=["NormalizeObservation"]) as env:
        with pytest.warns(UserWarning, match="max_episode_steps: trained 50, env 60\\)"):
            load_actor(path, env)
    with make_trained_env(path, num_envs=2) as env, warnings.catch_warnings():
        warnings.simplefilter("error")
        load_actor(path, env)
    import gymnasium
    with pv.make(lambda: gymnasium.make("CartPole-v1"), num_envs=1, backend="serial") as env, \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        load_actor(path, env)
