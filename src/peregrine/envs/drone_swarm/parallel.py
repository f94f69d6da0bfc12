"""DroneSwarm as a PettingZoo ParallelEnv: one instance, agents drone_0 ... drone_{n-1}.

    from peregrine.envs import drone_swarm
    env = drone_swarm.parallel_env(n_drones=4, render_mode="rgb_array")
    observations, infos = env.reset(seed=0)
    while env.agents:
        actions = {agent: env.action_space(agent).sample() for agent in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)

It steps a native batch of one instance (the C core, same rules and seeds as
`peregrine.make("drone_swarm", num_envs=1, seed=...)`), and exists for code
that takes a PettingZoo env. For throughput use the batch itself: every drone
of every instance is a row (see the README, "PettingZoo").

Agents and liveness: DroneSwarm never removes a drone from an episode. A drone
whose battery is empty stays an agent (it cannot move; its observation shows
battery 0), so `agents` is every drone until the episode ends, for all drones
at once (all victims delivered or all batteries empty: terminated; step limit:
truncated); then `agents` is empty until `reset`. The returned observations of
that last step are the episode's final ones. `infos[agent]["episode"]` then
holds the episode statistics (episode_return, episode_length, delivered, ...)
and, under SB3's Monitor keys, "r" (that agent's own return, float), "l"
(the episode's length in steps, int) and "t" (seconds since the env was made,
rounded to 1e-6, as SB3's Monitor writes it): SB3 reads those from any info
that has "episode", e.g. PPO over SuperSuit's concat_vec_envs_v1(...,
base_class="stable_baselines3").

Actions: a dict holding every agent of `agents`, each a 3-vector (vx, vy, scan)
in [-1, 1] (the native rules clamp; NaN/inf become 0). A missing or unknown
agent, or a value of another shape, is a ValueError naming it.

Render (PettingZoo's modes): `render_mode="rgb_array"` returns a top-down
frame (uint8 [H, W, 3], see render.py) of the current state; `render_size`
sets H = W (default 320). `render_mode="human"` shows that frame in a
matplotlib window after every reset and step, as PettingZoo's own envs do,
and render() returns None (needs matplotlib, in the `train` extra; without a
display, matplotlib's non-interactive backend shows nothing and says so).
Every human-mode env has a window of its own: closing one env closes only
its window.

PettingZoo's conventions: `max_cycles=k` is the episode's step limit (the
config field `max_steps`); `env(...)` is the AEC version (PettingZoo's
parallel_to_aec); `state()` / `state_space` are the global state (see state()).

Copies and pickles (copy.copy, copy.deepcopy, cloudpickle, as SuperSuit's
vector constructors make them) are independent envs over a new batch in the
same state (NativeEnv.__reduce__).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
from gymnasium import logger, spaces
from pettingzoo import ParallelEnv

from ..native.batch import IndependentCopies
from . import DroneSwarm

RENDER_MODES = ("human", "rgb_array")


class DroneSwarmParallelEnv(IndependentCopies, ParallelEnv):
    """One DroneSwarm instance behind PettingZoo's ParallelEnv API (see module doc)."""

    metadata = {"name": "drone_swarm_v0", "render_modes": list(RENDER_MODES),
                "is_parallelizable": True, "render_fps": 10}

    def __init__(self, render_mode: str | None = None, render_size: int = 320,
                 preset: str = "default", max_cycles: int | None = None, **config: Any) -> None:
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode must be None or one of {list(RENDER_MODES)}, "
                             f"got {render_mode!r}")
        if isinstance(render_size, bool) or not isinstance(render_size, int) or render_size < 32:
            raise ValueError(f"render_size must be an int >= 32, got {render_size!r}")
        if max_cycles is not None:
            if "max_steps" in config:
                raise ValueError("give max_cycles (PettingZoo's name) or max_steps, not both")
            config["max_steps"] = max_cycles
        self.render_mode = render_mode
        self.render_size = render_size
        self._window: _Window | None = None
        self._env = DroneSwarm(num_envs=1, preset=preset, **config)
        self.config = self._env.config
        self.possible_agents = [f"drone_{i}" for i in range(self._env.agents_per_env)]
        self.agents: list[str] = []
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}
        # One space object per agent, returned every time (PettingZoo expects that).
        self.observation_spaces = {agent: self._env.single_observation_space
                                   for agent in self.possible_agents}
        self.action_spaces = {agent: self._env.single_action_space for agent in self.possible_agents}
        self.state_space = self._make_state_space()
        # SB3 Monitor's "r", "l" and "t" (module doc). Wall-clock time, as the
        # Monitor's: a copy pickled into a SuperSuit worker process keeps its start.
        self._created = time.time()
        self._returns = np.zeros(len(self.possible_agents), np.float64)
        self._length = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Box:
        return self.action_spaces[agent]

    def _observations(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {agent: rows[i].copy() for agent, i in self._index.items()}

    def reset(self, seed: int | None = None,
              options: dict | None = None) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
        """Starts an episode; with a seed, the instance's random stream restarts
        from it (same seed -> same episode), without one the stream continues."""
        observations, _ = self._env.reset(seed=seed)
        self._env.instance_stats(clear=True)
        self._returns[:] = 0.0
        self._length = 0
        self.agents = list(self.possible_agents)
        if self.render_mode == "human":
            self.render()
        return self._observations(observations), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, np.ndarray]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise RuntimeError("step() after the episode ended (agents is empty); call reset()")
        if not isinstance(actions, dict):
            raise ValueError(f"actions must be a dict agent -> action, got {type(actions).__name__}")
        unknown = sorted(set(actions) - set(self.agents), key=str)
        missing = [agent for agent in self.agents if agent not in actions]
        if unknown or missing:
            raise ValueError(f"actions must hold exactly the live agents {self.agents}; "
                             f"missing {missing}, unknown {unknown}")
        buffer = self._env.actions
        for agent, action in actions.items():
            value = np.asarray(action, dtype=np.float32)
            if value.shape != buffer.shape[1:]:
                raise ValueError(f"action of {agent!r} must have shape {buffer.shape[1:]}, "
                                 f"got {value.shape}")
            buffer[self._index[agent]] = value
        _, rewards, terminals, truncations, _ = self._env.step(buffer)
        self._returns += rewards
        self._length += 1
        ended = bool(terminals[0] or truncations[0])  # every drone ends with its instance
        rows = self._env.final_observations if ended else self._env.observations
        observations = self._observations(rows)
        reward = {agent: float(rewards[i]) for agent, i in self._index.items()}
        terminated = {agent: bool(terminals[i]) for agent, i in self._index.items()}
        truncated = {agent: bool(truncations[i]) for agent, i in self._index.items()}
        infos: dict[str, dict] = {agent: {} for agent in self.agents}
        if ended:
            episodes, sums = self._env.instance_stats(clear=True)
            statistics = {}
            if episodes[0] == 1:
                statistics = dict(zip(self._env.stat_names, (float(v) for v in sums[0])))
            elapsed = round(time.time() - self._created, 6)
            for agent, i in self._index.items():
                infos[agent]["episode"] = {**statistics, "r": float(self._returns[i]),
                                           "l": self._length, "t": elapsed}
            self.agents = []
        if self.render_mode == "human":
            self.render()
        return observations, reward, terminated, truncated, infos

    def render(self) -> np.ndarray | None:
        """The current state as an RGB array (render_mode "rgb_array"); shown in
        a window and None ("human"); None with a warning without a render_mode."""
        if self.render_mode is None:
            logger.warn("render() called without a render_mode; pass render_mode='rgb_array' "
                        "(or 'human') to drone_swarm.parallel_env")
            return None
        from .reference import decode_state
        from .render import draw_frame
        state = decode_state(self._env.get_state(0), self.config)
        frame = np.asarray(draw_frame(state, self.config, size=self.render_size))
        if self.render_mode == "rgb_array":
            return frame
        if self._window is None:
            self._window = _Window(f"{self.metadata['name']}")
        self._window.show(frame)
        return None

    # ---- the global state (PettingZoo's state() / state_space) ----------------------------
    def _make_state_space(self) -> spaces.Box:
        """The env's own global state (every drone, victim and obstacle, the time;
        package docstring, "Global state"), written by the batch from now on: one
        instance, so writing it costs next to nothing."""
        self._env.enable_states()
        return self._env.single_state_space

    def state(self) -> np.ndarray:
        """The global state: float32 [state_dim] in `state_space` ([-1, 1]), every
        drone and victim and the time, normalised for learning, for a centralised
        critic. After the step that ended an episode it is the state the episode
        ended on, like the observations that step returned. The exact simulator
        state is exact_state()."""
        batch = self._env
        ended = bool(batch.terminals[0] or batch.truncations[0])   # cleared by reset
        return (batch.final_states if ended else batch.states)[0].copy()

    def exact_state(self) -> np.ndarray:
        """The instance's exact state (flat float64; layout in the package
        docstring): for debugging and set_state, not for learning."""
        return self._env.get_state(0)

    def close(self) -> None:
        if self._window is not None:
            self._window.close()
            self._window = None
        self._env.close()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_window"] = None   # a window belongs to the process that opened it
        return state


class _Window:
    """A matplotlib window showing frames (render_mode "human")."""

    def __init__(self, title: str) -> None:
        try:
            import matplotlib.pyplot as pyplot
        except ImportError as error:
            raise ImportError("render_mode='human' shows frames with matplotlib: pip install "
                              "'peregrine-rl[train]' (or use render_mode='rgb_array')") from error
        self.pyplot = pyplot
        # A new figure, not one found by name (num=title): that would make a
        # second env fail (matplotlib refuses an existing num) or share the
        # first's window, which closing either env would then close.
        self.figure, axes = pyplot.subplots()
        self.figure.canvas.manager.set_window_title(title)
        axes.set_axis_off()
        self.image = None
        self.axes = axes

    def show(self, frame: np.ndarray) -> None:
        if self.image is None:
            self.image = self.axes.imshow(frame)
            self.pyplot.show(block=False)
        else:
            self.image.set_data(frame)
        self.figure.canvas.draw_idle()
        self.figure.canvas.flush_events()

    def close(self) -> None:
        self.pyplot.close(self.figure)


def parallel_env(render_mode: str | None = None, **config) -> DroneSwarmParallelEnv:
    """A DroneSwarm ParallelEnv; keywords are DroneSwarm's config fields, `preset`,
    `render_size` and `max_cycles`."""
    return DroneSwarmParallelEnv(render_mode=render_mode, **config)


def env(render_mode: str | None = None, **config):
    """The AEC version (agents act in turn), as PettingZoo's `env()` is:
    parallel_to_aec over parallel_env(...), same keywords."""
    from pettingzoo.utils.conversions import parallel_to_aec
    return parallel_to_aec(parallel_env(render_mode=render_mode, **config))
