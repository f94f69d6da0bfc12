"""Conventions that third-party clients read from Peregrine's exports.

SB3's Monitor keys in the PettingZoo env's episode infos (SB3 over SuperSuit's
recipe reads info["episode"]["r"]), one matplotlib window per human-mode
PettingZoo env, and metadata["render_fps"] on every Gymnasium and SB3 export
(video recorders write at that rate).
"""
from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import time

import gymnasium
import numpy as np
import pytest

import peregrine.vector as pv
from peregrine.envs.registry import GYMNASIUM_IDS, RENDERERS

SMALL_SWARM = {"n_drones": 2, "n_victims": 2, "max_cycles": 8}


def renderer_fps(name):
    return importlib.import_module(RENDERERS[name]).RENDER_FPS


# ---- SB3 Monitor's keys in the PettingZoo env's episode infos -----------------------------------

def test_parallel_env_episode_info_has_sb3_monitor_keys():
    pytest.importorskip("pettingzoo")
    from peregrine.envs import drone_swarm
    made = time.time()
    env = drone_swarm.parallel_env(**SMALL_SWARM)
    rng = np.random.default_rng(0)
    times = []
    for episode in range(2):   # the second checks that reset starts r and l afresh
        env.reset(seed=episode)
        returns = dict.fromkeys(env.possible_agents, 0.0)
        steps = 0
        while env.agents:
            actions = {agent: rng.uniform(-1, 1, 3).astype(np.float32) for agent in env.agents}
            _, rewards, _, _, infos = env.step(actions)
            steps += 1
            for agent, reward in rewards.items():
                returns[agent] += reward
        assert steps == SMALL_SWARM["max_cycles"]
        records = [infos[agent]["episode"] for agent in env.possible_agents]
        for agent, record in zip(env.possible_agents, records):
            assert isinstance(record["r"], float) and record["r"] == pytest.approx(returns[agent])
            assert isinstance(record["l"], int) and record["l"] == steps
            assert isinstance(record["t"], float) and record["t"] == round(record["t"], 6)
            assert 0.0 <= record["t"] <= time.time() - made
            # the env's own statistics are still there: episode_return is the drones' mean
            assert record["episode_length"] == steps
            assert record["episode_return"] == pytest.approx(np.mean(list(returns.values())),
                                                             abs=1e-5)
        assert records[0]["r"] != records[1]["r"]   # each agent's own return
        times.append(records[0]["t"])
    assert times[1] >= times[0]   # since the env was made, as SB3's Monitor counts
    env.close()


def test_sb3_ppo_learns_over_supersuits_vector_recipe():
    pytest.importorskip("pettingzoo")
    pytest.importorskip("stable_baselines3")
    supersuit = pytest.importorskip("supersuit",
                                    reason="supersuit comes with the `conformance` extra")
    import torch
    from stable_baselines3 import PPO
    from peregrine.envs import drone_swarm

    torch.set_num_threads(1)
    vec = supersuit.pettingzoo_env_to_vec_env_v1(drone_swarm.parallel_env(**SMALL_SWARM))
    envs = supersuit.concat_vec_envs_v1(vec, 2, num_cpus=0, base_class="stable_baselines3")
    assert envs.num_envs == 2 * SMALL_SWARM["n_drones"]
    n_steps = 2 * SMALL_SWARM["max_cycles"]
    # No seed=: PPO would call envs.seed(), which SuperSuit's ConcatVecEnv lacks.
    model = PPO("MlpPolicy", envs, n_steps=n_steps, batch_size=16, n_epochs=1,
                device="cpu", verbose=0)
    model.learn(total_timesteps=2 * n_steps * envs.num_envs)   # two rollouts
    episodes = list(model.ep_info_buffer)
    # two rollouts of two 8-step episodes each, for every drone of both copies
    assert len(episodes) == 4 * envs.num_envs
    assert all(info["l"] == SMALL_SWARM["max_cycles"] and np.isfinite(info["r"])
               for info in episodes)
    envs.close()


# ---- one window per human-mode PettingZoo env ------------------------------------------------

@pytest.mark.filterwarnings("ignore:FigureCanvasAgg is non-interactive")
def test_two_human_mode_envs_each_get_their_own_window():
    pytest.importorskip("pettingzoo")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")   # no display needed: the figures exist all the same
    import matplotlib.pyplot as pyplot
    from peregrine.envs import drone_swarm

    first = drone_swarm.parallel_env(render_mode="human", render_size=64, **SMALL_SWARM)
    second = drone_swarm.parallel_env(render_mode="human", render_size=64, **SMALL_SWARM)
    try:
        first.reset(seed=0)
        second.reset(seed=1)   # raised "Figure 'drone_swarm_v0' already exists"
        figures = first._window.figure, second._window.figure
        assert figures[0] is not figures[1]
        assert {figure.number for figure in figures} <= set(pyplot.get_fignums())
        shown = second._window.image.get_array().copy()

        first.close()
        assert not pyplot.fignum_exists(figures[0].number)
        assert pyplot.fignum_exists(figures[1].number)   # the other window stays open
        for _ in range(3):
            second.step({agent: np.array([1.0, 1.0, 0.0], np.float32) for agent in second.agents})
        assert second._window.figure is figures[1]
        assert not np.array_equal(second._window.image.get_array(), shown)   # still drawn into
    finally:
        first.close()
        second.close()
    assert not pyplot.fignum_exists(figures[1].number)


# ---- metadata["render_fps"] on every export ---------------------------------------------------

@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_every_export_has_its_renderers_fps_whatever_the_render_mode(name):
    fps = renderer_fps(name)
    exports = [gymnasium.make_vec(f"peregrine/{GYMNASIUM_IDS[name]}",
                                  num_envs=2),
               pv.gymnasium_vector_env(name, num_envs=2),
               pv.gymnasium_vector_env(name, num_envs=2, render_mode="rgb_array"),
               pv.GymnasiumVectorEnv(pv.make(name, num_envs=2, seed=0))]
    if name != "drone_swarm":   # multi-agent by default: no single-agent gymnasium.Env view
        exports += [gymnasium.make(f"peregrine/{GYMNASIUM_IDS[name]}"),
                    pv.GymnasiumEnv(name), pv.GymnasiumEnv(name, render_mode="rgb_array")]
    for env in exports:
        assert env.metadata["render_fps"] == fps, type(env).__name__
        assert env.metadata["render_modes"] == ["rgb_array"]
        env.close()


def test_sb3_vec_env_metadata_and_video_recorder_fps(tmp_path):
    pytest.importorskip("stable_baselines3")
    assert renderer_fps("cartpole") == 50
    plain = pv.sb3_vec_env(pv.make("cartpole", num_envs=2, seed=0))
    assert plain.metadata == {"render_modes": [], "render_fps": 50}
    plain.close()
    drawn = pv.sb3_vec_env(pv.make("cartpole", num_envs=2, seed=0), render_mode="rgb_array")
    assert drawn.metadata["render_fps"] == 50 and "rgb_array" in drawn.metadata["render_modes"]
    if importlib.util.find_spec("moviepy") is not None:   # VecVideoRecorder needs it
        from stable_baselines3.common.vec_env import VecVideoRecorder
        recorder = VecVideoRecorder(drawn, str(tmp_path), record_video_trigger=lambda step: False)
        assert recorder.frames_per_sec == 50   # was SB3's default, 30
    drawn.close()


def test_render_fps_needs_no_drawing_module():
    """drone_swarm's drawing module imports Pillow (the `train` extra): an env
    made without a render_mode states its fps without importing it."""
    code = ("import sys, gymnasium, peregrine;"
            "env = gymnasium.make_vec('peregrine/DroneSwarm-v0', num_envs=1);"
            "print(env.metadata['render_fps'], 'peregrine.envs.drone_swarm.render' in sys.modules,"
            " 'PIL' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(renderer_fps("drone_swarm")), "False", "False"]


def test_render_fps_computed_in_the_module_is_read_by_importing_it(tmp_path, monkeypatch):
    from peregrine.envs.native.drawing import render_fps as _render_fps
    (tmp_path / "computed_fps_renderer.py").write_text("TAU = 0.04\nRENDER_FPS = round(1 / TAU)\n")
    (tmp_path / "literal_fps_renderer.py").write_text("RENDER_FPS = 24  # a literal\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _render_fps("computed_fps_renderer") == 25
    sys.modules.pop("computed_fps_renderer")   # imported to compute it; not left behind
    assert _render_fps("literal_fps_renderer") == 24
    assert "literal_fps_renderer" not in sys.modules   # read, not run


def test_sb3_vec_env_of_something_else_and_a_huge_state_index_are_named():
    import peregrine
    from peregrine.vector import sb3_vec_env
    pytest.importorskip("stable_baselines3")
    for wrong in (3, "cartpole"):
        with pytest.raises(TypeError, match="sb3_vec_env takes a Peregrine env"):
            sb3_vec_env(wrong)
    env = peregrine.make("cartpole", num_envs=4)
    try:
        for index in (2 ** 40, -2 ** 40, 4):
            with pytest.raises(IndexError, match=rf"instance {index} out of range \[0, 4\)"):
                env.get_state(index)
        with pytest.raises(IndexError, match="out of range"):
            env.set_state(2 ** 40, env.get_state(0))
    finally:
        env.close()
