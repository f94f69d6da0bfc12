"""What `evaluate`, `peregrine eval` and `peregrine render` accept as a policy and as
a world, and how they refuse the rest (also in an installation without torch)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import peregrine
from peregrine.cli import main
from peregrine.evaluate import evaluate


def test_a_policy_that_is_neither_name_path_nor_callable_is_refused():
    with pytest.raises(ValueError, match="policy must be a scripted policy name, a checkpoint "
                                         "path or a callable, got int"):
        evaluate("cartpole", 42, episodes=1)


@pytest.mark.parametrize("seed", [-1, True, 1.5, "3"])
def test_a_seed_that_is_not_a_non_negative_int_is_refused(seed):
    with pytest.raises(ValueError, match="seed must be a non-negative int, got"):
        evaluate("cartpole", "random", episodes=1, seed=seed)


class Counting:
    """A policy object whose reset takes no env (the documented alternative)."""

    def __init__(self):
        self.resets = 0

    def reset(self):
        self.resets += 1

    def __call__(self, observations):
        return (observations[:, 2] > 0).astype(np.int32)


def test_a_policy_whose_reset_takes_no_env_is_reset_every_round():
    policy = Counting()
    result = evaluate("cartpole", policy, episodes=5, num_envs=2, seed=1)
    assert result["episodes"] == 5
    assert policy.resets == 3          # rounds of 2, 2 and 1 instances


def test_actions_as_a_column_are_accepted_for_a_discrete_env():
    def column(observations):
        return (observations[:, 2:3] > 0).astype(np.int32)      # shape (rows, 1)

    def flat(observations):
        return (observations[:, 2] > 0).astype(np.int32)
    assert evaluate("cartpole", column, episodes=3, seed=4)["mean"] == \
        evaluate("cartpole", flat, episodes=3, seed=4)["mean"]


def test_a_checkpoint_that_fails_to_build_is_a_value_error_naming_it(tmp_path):
    pytest.importorskip("torch")          # the trainer writes the checkpoint
    from peregrine.train import checkpoint
    from peregrine.train.config import load_config
    from peregrine.train.ppo import Trainer
    trainer = Trainer(load_config("cartpole", overrides=[("vec.num_envs", 2), ("train.horizon", 8),
                                                          ("train.minibatch_size", 16)]))
    payload = trainer.state_dict()
    trainer.close()
    payload["config"]["policy"]["no_such_option"] = 1      # PolicyConfig(**...) -> TypeError
    path = tmp_path / "odd.pt"
    checkpoint.save(path, payload)
    with pytest.raises(ValueError, match=r"cannot load checkpoint .*odd.pt'?: TypeError"):
        evaluate("cartpole", str(path), episodes=1)


def test_without_torch_a_checkpoint_is_a_clear_error_and_names_still_work(tmp_path):
    path = tmp_path / "some.pt"
    path.write_bytes(b"x")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None            # an installation without the train extra
        import peregrine
        from peregrine.evaluate import evaluate
        from peregrine.policies import make_policy
        print(evaluate("cartpole", "random", episodes=2)["episodes"])
        for call in (lambda: evaluate("cartpole", {str(path)!r}, episodes=1),
                     lambda: make_policy("cartpole", {str(path)!r}, peregrine.make("cartpole"))):
            try:
                call()
            except ValueError as error:
                print(error)
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "2"
    assert "cannot read checkpoint" in lines[1] and "(needs torch) is not available" in lines[1]
    assert "cannot load checkpoint" in lines[2] and "needs torch) is not available" in lines[2]


# ---- the command line's world and output options --------------------------------------------

def test_eval_env_preset_token_selects_the_preset(capsys):
    assert main(["eval", "drone_swarm", "--policy", "random", "--episodes", "1", "--json",
                 "--env.preset", "wilderness", "--env.max-steps", "5"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["preset"] == "wilderness" and result["env_config"]["max_steps"] == 5
    from peregrine.envs.drone_swarm import WILDERNESS
    assert result["env_config"]["world_size"] == WILDERNESS["world_size"]


def test_eval_refuses_to_override_the_env_name(capsys):
    assert main(["eval", "cartpole", "--env.name", "pendulum"]) == 2
    assert "--env.name cannot be overridden; the env is the ENV argument" in \
        capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0", "--out", "x.gif"], "--steps must be positive, got 0"),
    (["--out", "x.png"], "--out must be a .gif path, got 'x.png'"),
])
def test_render_refuses_bad_steps_and_formats(tmp_path, capsys, argv, message):
    assert main(["render", "drone_swarm", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, message", [
    ({"every": 0}, "every must be a positive int, got 0"),
    ({"size": 16}, r"size must be an int in \[32, 2048\], got 16"),
    ({"size": 100.0}, "size must be an int"),
    ({"max_steps": 0}, "steps must be positive, got 0"),
])
def test_render_episode_refuses_bad_arguments(tmp_path, kwargs, message):
    from peregrine.envs.drone_swarm.render import render_episode
    with peregrine.make("drone_swarm", num_envs=1, seed=0) as env:
        with pytest.raises(ValueError, match=message):
            render_episode(env, lambda obs: np.zeros((len(obs), 3), np.float32),
                           tmp_path / "x.gif", **kwargs)
    assert not (tmp_path / "x.gif").exists()


def test_large_frames_ring_scanning_drones_with_their_sensing_range():
    from peregrine.envs.drone_swarm.reference import decode_state
    from peregrine.envs.drone_swarm.render import COLOURS, draw_frame
    with peregrine.make("drone_swarm", num_envs=1, seed=0, n_drones=2, n_victims=1) as env:
        state = decode_state(env.get_state(0), env.config)
        config = dict(env.config)
    drones = state["drones"]
    drones["x"][:], drones["y"][:] = [30.0, 70.0], [70.0, 70.0]
    drones["battery"][:], drones["scanning"][:] = [0.5, 0.5], [1.0, 0.0]
    state["victims"]["x"][:], state["victims"]["y"][:] = [50.0], [10.0]
    r_sense = float(config["r_sense"])

    def ring(size):
        """World distances from drone 0 of the pixels in the sensing colour."""
        pixels = np.asarray(draw_frame(state, config, size=size))
        rows, cols = np.nonzero((pixels == COLOURS["sense"]).all(-1))
        scale = (size - 1) / float(config["world_size"])
        return np.hypot(cols / scale - 30.0, ((size - 1) - rows) / scale - 70.0)
    large = ring(400)
    assert len(large) > 100                              # a whole ring was drawn ...
    assert np.all(np.abs(large - r_sense) < 2.0)         # ... around the scanning drone only
    assert len(ring(200)) == 0                           # small frames leave it out
