"""evaluate(), `peregrine eval` and `peregrine render`: counts, output formats, clear errors."""
import json

import numpy as np
import pytest

from peregrine.cli import main
from peregrine.envs.drone_swarm import STAT_NAMES
from peregrine.evaluate import evaluate, scripted_policy_names


@pytest.mark.parametrize("episodes,num_envs", [(5, None), (5, 2), (3, 8)])
def test_evaluate_counts_exactly_the_requested_episodes(episodes, num_envs):
    result = evaluate("drone_swarm", "lawnmower", episodes=episodes, seed=0, num_envs=num_envs)
    assert result["episodes"] == episodes
    assert set(result["mean"]) == set(STAT_NAMES) == set(result["std"])
    assert all(np.isfinite(v) for v in result["mean"].values())
    assert all(v >= 0 for v in result["std"].values())


def test_evaluate_is_deterministic_and_seed_dependent():
    a = evaluate("drone_swarm", "voronoi", episodes=4, seed=11)
    b = evaluate("drone_swarm", "voronoi", episodes=4, seed=11)
    c = evaluate("drone_swarm", "voronoi", episodes=4, seed=12)
    assert a == b
    assert a["mean"] != c["mean"]


def _cartpole_mixed(observations):
    """Instance 0 always pushes right (falls in ~10 steps); the others balance."""
    theta, theta_dot = observations[:, 2], observations[:, 3]
    actions = (theta + 0.5 * theta_dot > 0).astype(np.int32)
    actions[0] = 1
    return actions


def test_only_each_instances_first_episode_counts():
    import peregrine
    env = peregrine.make("cartpole", num_envs=3, seed=5)
    observations = env.observations
    first_length = np.zeros(3)
    for step in range(1, 501):
        observations, _, terminals, truncations, _ = env.step(_cartpole_mixed(observations))
        first_length[(terminals | truncations) & (first_length == 0)] = step
    env.close()
    assert first_length[0] < 50 and first_length.min() > 0  # instance 0 ended many times
    result = evaluate("cartpole", _cartpole_mixed, episodes=3, seed=5)
    assert result["episodes"] == 3
    assert result["mean"]["episode_length"] == pytest.approx(first_length.mean())


def test_rounds_combine_exactly():
    def push_right(observations):
        return np.ones(observations.shape[0], np.int32)

    singles = [evaluate("cartpole", push_right, episodes=1, seed=s)["mean"]["episode_length"]
               for s in (0, 1_000_003, 2_000_006)]
    combined = evaluate("cartpole", push_right, episodes=3, seed=0, num_envs=1)
    assert len(set(singles)) > 1
    assert combined["mean"]["episode_length"] == pytest.approx(np.mean(singles))
    assert combined["std"]["episode_length"] == pytest.approx(np.std(singles))


def test_generic_random_policy_works_for_other_envs():
    assert scripted_policy_names("cartpole") == ["random"]
    assert scripted_policy_names("drone_swarm") == ["lawnmower", "random", "voronoi"]
    result = evaluate("cartpole", "random", episodes=50, seed=0)
    assert result["episodes"] == 50
    # uniform random CartPole lasts about 22 steps on average
    assert 12 < result["mean"]["episode_length"] < 35


def test_evaluate_accepts_a_policy_object():
    calls = []

    def hover(observations):
        calls.append(observations.shape)
        return np.zeros((observations.shape[0], 3), np.float32)

    result = evaluate("drone_swarm", hover, episodes=2, seed=0, max_steps=30)
    assert result["episodes"] == 2 and result["mean"]["delivered"] == 0.0
    assert result["mean"]["episode_length"] == 30.0 and calls


@pytest.mark.parametrize("bad,match", [("spiral", "lawnmower"), ("no/such/checkpoint.pt", "no checkpoint")])
def test_bad_policy_is_refused_clearly(bad, match):
    with pytest.raises(ValueError, match=match):
        evaluate("drone_swarm", bad, episodes=1)


def test_bad_checkpoint_file_is_refused_clearly(tmp_path):
    path = tmp_path / "broken.pt"
    path.write_bytes(b"not a checkpoint at all")
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="broken.pt"):
        evaluate("drone_swarm", str(path), episodes=1)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="episodes"):
        evaluate("drone_swarm", "random", episodes=0)
    with pytest.raises(ValueError, match="unknown env"):
        evaluate("no_such_env", "random", episodes=1)
    with pytest.raises(ValueError, match="preset"):
        evaluate("drone_swarm", "random", episodes=1, preset="nope")


def test_checkpoint_policy_is_evaluated(tmp_path):
    pytest.importorskip("torch")
    from dataclasses import asdict

    import peregrine
    from peregrine.train.checkpoint import save
    from peregrine.train.config import PolicyConfig
    from peregrine.train.policy import Policy, describe_space

    env = peregrine.make("drone_swarm", num_envs=1, seed=0)
    policy = Policy(env.single_observation_space, env.single_action_space, PolicyConfig())
    path = tmp_path / "untrained.pt"
    save(path, {"policy": policy.state_dict(), "config": {"policy": asdict(PolicyConfig())},
                "observation_space": describe_space(env.single_observation_space),
                "action_space": describe_space(env.single_action_space), "env_name": "drone_swarm"})
    env.close()
    result = evaluate("drone_swarm", str(path), episodes=2, seed=0, max_steps=20)
    assert result["episodes"] == 2 and result["mean"]["episode_length"] == 20.0


def _untrained_checkpoint(path, env_name):
    from dataclasses import asdict

    import torch

    import peregrine
    from peregrine.train.checkpoint import save
    from peregrine.train.config import PolicyConfig
    from peregrine.train.policy import Policy, describe_space

    env = peregrine.make(env_name, num_envs=1, seed=0)
    torch.manual_seed(0)        # the same untrained weights every run
    policy = Policy(env.single_observation_space, env.single_action_space, PolicyConfig())
    save(path, {"policy": policy.state_dict(), "config": {"policy": asdict(PolicyConfig())},
                "observation_space": describe_space(env.single_observation_space),
                "action_space": describe_space(env.single_action_space), "env_name": env_name})
    env.close()
    return str(path)


def test_sampled_actions_are_seeded_and_differ_from_the_mode(tmp_path, capsys):
    """`sample`: the checkpoint's actor draws its actions from a generator seeded by the
    evaluation's seed (the same seed, the same episodes), not its argmax; a scripted
    policy has no distribution to sample and is refused."""
    pytest.importorskip("torch")
    path = _untrained_checkpoint(tmp_path / "untrained.pt", "cartpole")
    mode = evaluate("cartpole", path, episodes=32, seed=0)
    sampled = evaluate("cartpole", path, episodes=32, seed=0, sample=True)
    assert (mode["actions"], sampled["actions"]) == ("mode", "sampled")
    assert sampled == evaluate("cartpole", path, episodes=32, seed=0, sample=True)
    assert sampled["mean"] != evaluate("cartpole", path, episodes=32, seed=1, sample=True)["mean"]
    assert sampled["mean"] != mode["mean"]
    # the actor itself: an untrained policy's probabilities are near 1/2, so its samples
    # differ from its argmax on about half of the rows, the same ones for the same seed
    import peregrine
    from peregrine.train.checkpoint import load_actor
    env = peregrine.make("cartpole", num_envs=1, seed=0)
    rows = np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32)
    argmax = load_actor(path, env)(rows)
    drawn = load_actor(path, env, sample_seed=3)(rows)
    env.close()
    assert 0.25 < np.mean(drawn != argmax) < 0.75
    np.testing.assert_array_equal(drawn, load_actor(path, env, sample_seed=3)(rows))
    from peregrine.train import load_actor as package_load_actor   # the package's, too
    np.testing.assert_array_equal(drawn, package_load_actor(path, env, sample_seed=3)(rows))
    for bad in (1.5, -1, 2 ** 64):      # 1.5 was taken as 1; 2**64 overflowed in torch
        with pytest.raises(ValueError, match="seed must be"):
            load_actor(path, env, sample_seed=bad)
    with pytest.raises(ValueError, match="not a checkpoint"):
        evaluate("cartpole", "random", episodes=2, sample=True)
    assert main(["eval", "cartpole", "--policy", path, "--episodes", "32", "--sample",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mean"] == sampled["mean"]


def test_eval_cli_json_parses(capsys):
    assert main(["eval", "drone_swarm", "--policy", "voronoi", "--episodes", "3", "--seed", "2",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 3 and result["policy"] == "voronoi"
    assert set(result["mean"]) == set(STAT_NAMES)


def test_eval_cli_prints_mean_and_std(capsys):
    assert main(["eval", "cartpole", "--episodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "episode_return" in out and "±" in out


def test_eval_cli_bad_policy_is_a_clean_error(capsys):
    assert main(["eval", "drone_swarm", "--policy", "spiral", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "spiral" in err and "voronoi" in err and "Traceback" not in err


def test_render_writes_a_multi_frame_gif(tmp_path, capsys):
    from PIL import Image
    out = tmp_path / "swarm.gif"
    assert main(["render", "drone_swarm", "--policy", "lawnmower", "--out", str(out),
                 "--steps", "20", "--seed", "1"]) == 0
    with Image.open(out) as gif:
        assert gif.format == "GIF" and gif.n_frames > 1 and gif.size == (200, 200)
        gif.seek(gif.n_frames - 1)
        colours = {c for _, c in gif.convert("RGB").getcolors(4096)}
    assert (40, 90, 220) in colours or (215, 40, 40) in colours  # victims are drawn


def test_render_full_episode_ends_with_a_summary_frame(tmp_path):
    import peregrine
    from peregrine.envs.drone_swarm.render import render_episode
    from peregrine.envs.scripted import make_scripted_policy
    env = peregrine.make("drone_swarm", num_envs=1, seed=4)
    policy = make_scripted_policy("drone_swarm", "voronoi", env)
    result = render_episode(env, policy, tmp_path / "ep.gif", every=4, size=96)
    env.close()
    assert result["steps"] < 800 and result["delivered"] == 10
    assert result["frames"] == 2 + (result["steps"] - 1) // 4


def test_a_native_env_without_render_episode_is_drawn_frame_by_frame(tmp_path, capsys):
    """CartPole's renderer has only rgb_frame: the command draws its frames itself."""
    out = tmp_path / "cartpole.gif"
    assert main(["render", "cartpole", "--out", str(out), "--every", "5"]) == 0
    from PIL import Image
    with Image.open(out) as gif:
        assert gif.n_frames >= 2 and gif.size == (600, 400)
    assert "episode_length" in capsys.readouterr().out


def test_render_errors_are_clean(tmp_path, capsys):
    assert main(["render", "gym:NoSuchEnv-v0", "--out", str(tmp_path / "x.gif")]) == 2
    assert "NoSuchEnv" in capsys.readouterr().err
    assert main(["render", "drone_swarm", "--policy", "spiral", "--out", str(tmp_path / "x.gif")]) == 2
    assert "spiral" in capsys.readouterr().err


def test_policy_returning_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="shape"):
        evaluate("drone_swarm", lambda observations: np.zeros((1, 3), np.float32), episodes=2)


def test_frame_colours_drones_and_victims_by_state():
    import peregrine
    from peregrine.envs.drone_swarm.reference import decode_state
    from peregrine.envs.drone_swarm.render import COLOURS, draw_frame
    env = peregrine.make("drone_swarm", num_envs=1, seed=0, n_drones=3, n_victims=3)
    state = decode_state(env.get_state(0), env.config)
    env.close()
    drones, victims = state["drones"], state["victims"]
    drones["x"][:], drones["y"][:] = [55.0, 90.0, 10.0], [50.0, 90.0, 90.0]
    drones["battery"][:], drones["connected"][:] = [0.5, 0.5, 0.0], [1, 0, 0]
    victims["x"][:], victims["y"][:] = [20.0, 80.0, 30.0], [20.0, 20.0, 70.0]
    victims["status"][:], victims["owner"][:] = [0, 1, 2], [-1, 1, -1]
    image = draw_frame(state, env.config, size=200)
    scale = 199 / 100.0

    def colour_at(x, y):
        return image.getpixel((int(round(x * scale)), int(round(199 - y * scale))))

    assert colour_at(55, 50) == COLOURS["connected"]
    assert colour_at(90, 90) == COLOURS["cut_off"]
    assert colour_at(10, 90) == COLOURS["empty"]
    assert colour_at(20, 20) == COLOURS["unknown"]
    assert colour_at(80, 20) == COLOURS["confirmed"]
    assert colour_at(30, 70) == COLOURS["delivered"]
    assert colour_at(50, 58) == COLOURS["range"]         # inside r_comm of the base, nothing drawn
    assert colour_at(50, 50) == COLOURS["base"]


def test_an_evaluation_probes_a_factory_once_and_builds_each_round_env_once():
    """6 episodes over 4 envs: rounds of 4 and 2 envs, so 6 constructions, plus one probe
    for the whole evaluation (each round's vector env reuses what it learned)."""
    import any_env_toys
    from peregrine.evaluate import evaluate
    any_env_toys.COUNTED_CHAINS.clear()
    result = evaluate("any_env_toys:counted_chain_env", "random", episodes=6, num_envs=4,
                      length=3)
    assert result["episodes"] == 6
    assert any_env_toys.COUNTED_CHAINS == [3] * 7


def test_a_policy_returning_floats_for_a_discrete_env_or_nothing_is_refused():
    """0.9 cast to CartPole's int action would be 0: refused, as the Gymnasium export
    refuses it, instead of evaluating another policy silently."""
    from peregrine.evaluate import evaluate
    with pytest.raises(ValueError, match="must be integers, got dtype float64"):
        evaluate("cartpole", lambda o: (o[:, 2] > 0) * 0.9, episodes=4)
    with pytest.raises(ValueError, match="the policy returned None"):
        evaluate("cartpole", lambda o: None, episodes=4)
    assert evaluate("cartpole", lambda o: (o[:, 2] > 0).astype(np.int64),
                    episodes=4)["episodes"] == 4
    with pytest.raises(ValueError, match=r"actions of shape \(3,\); the batch of 4 instance"):
        evaluate("cartpole", lambda o: np.zeros(3, np.int32), episodes=4, num_envs=4)


def test_render_takes_actions_as_eval_does():
    """render's loop converts a policy's actions with eval's policy_actions: a float
    action of a discrete env is refused there too (it was cast to 0, drawing another
    policy's episode)."""
    import peregrine
    from peregrine.cli.render import _episode_frames
    env = peregrine.make("cartpole", num_envs=1, seed=0)
    try:
        env.reset(seed=0)
        with pytest.raises(ValueError, match="must be integers, got dtype float64"):
            _episode_frames(env, lambda o: (o[:, 2] > 0) * 0.9, lambda: None, 1, 10)
        frames, steps = _episode_frames(env, lambda o: (o[:, 2] > 0).astype(np.int64),
                                        lambda: 0, 1, 500)
        assert 1 < steps < 500 and len(frames) == steps
    finally:
        env.close()


def test_a_seed_near_the_top_survives_the_rounds():
    """Rounds add 1,000,003 to the seed: at 2**64 - 1 the second round's seed overflowed
    ("seed must be less than 2**64") for a seed evaluate had accepted."""
    from peregrine.evaluate import evaluate
    assert evaluate("cartpole", "random", episodes=6, num_envs=2,
                    seed=2 ** 64 - 1)["episodes"] == 6
