"""Any native multi-agent env as a PettingZoo ParallelEnv: one instance, one agent a row.

    import peregrine
    env = peregrine.envs.registry.parallel_env("tag", render_mode="rgb_array")
    observations, infos = env.reset(seed=0)
    while env.agents:
        actions = {agent: env.action_space(agent).sample() for agent in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)

It steps a native batch of one instance (the C core: same rules and seeds as
`peregrine.make(name, num_envs=1, seed=...)`) for code that takes a PettingZoo env;
for throughput use the batch itself (every agent of every instance a row).

Agents are `<prefix>_0 ... <prefix>_{n-1}`, every row of the instance, for the whole
episode: a native instance ends all its rows together (terminated or truncated), then
`agents` is empty until `reset`, and the observations that step returned are the
episode's final ones. `infos[agent]["episode"]` then holds the env's episode
statistics plus Stable-Baselines3's Monitor keys: `r` (that agent's return), `l`
(the length) and `t` (seconds since the env was made).

Actions: a dict holding every live agent, each of the action space's shape; a missing
or unknown agent, or another shape, is a ValueError naming it. Render:
`render_mode="rgb_array"` returns the env's frame (its renderer's `rgb_frame`);
"human" shows it in a matplotlib window. `max_cycles=k` is the episode's step limit
(the config field `max_steps`, PettingZoo's name for it). `state()` / `state_space`
are the env's global state, where it has one. Copies and pickles are independent
envs over a new batch in the same state (NativeEnv.__reduce__).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
from gymnasium import logger, spaces
from pettingzoo import ParallelEnv

from . import drawing
from .batch import IndependentCopies

RENDER_MODES = ("human", "rgb_array")


class NativeParallelEnv(IndependentCopies, ParallelEnv):
    """One instance of a native env behind PettingZoo's ParallelEnv API (module doc)."""

    agent_prefix = "agent"

    def __init__(self, env_class, render_mode: str | None = None, render_size: int = 320,
                 max_cycles: int | None = None, renderer: str | None = None,
                 **config: Any) -> None:
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode must be None or one of {list(RENDER_MODES)}, "
                             f"got {render_mode!r}")
        if isinstance(render_size, bool) or not isinstance(render_size, int) or render_size < 32:
            raise ValueError(f"render_size must be an int >= 32, got {render_size!r}")
        if max_cycles is not None:
            if "max_steps" in config:
                raise ValueError("give max_cycles (PettingZoo's name) or max_steps, not both")
            config["max_steps"] = max_cycles
        self._renderer = renderer
        self.metadata = {"name": f"{env_class.name}_v0", "is_parallelizable": True,
                         "render_modes": list(RENDER_MODES) if self._can_draw() else []}
        fps = self._render_fps()
        if fps is not None:
            self.metadata["render_fps"] = fps
        self.render_mode = render_mode
        self.render_size = render_size
        self._window: Window | None = None
        self._env = env_class(num_envs=1, **config)
        self.config = self._env.config
        self.possible_agents = [f"{self.agent_prefix}_{i}"
                                for i in range(self._env.agents_per_env)]
        self.agents: list[str] = []
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}
        # One space object per agent, returned every time (PettingZoo expects that).
        self.observation_spaces = {agent: self._env.single_observation_space
                                   for agent in self.possible_agents}
        self.action_spaces = {agent: self._env.single_action_space for agent in self.possible_agents}
        if self._env.single_state_space is not None:
            self._env.enable_states()    # one instance: writing it costs next to nothing
            self.state_space = self._env.single_state_space
        # SB3 Monitor's "r", "l" and "t". Wall-clock time, as the Monitor's: a copy
        # pickled into a SuperSuit worker process keeps its start.
        self._created = time.time()
        self._returns = np.zeros(len(self.possible_agents), np.float64)
        self._length = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
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

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
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
            value = np.asarray(action, dtype=buffer.dtype)
            if value.shape != buffer.shape[1:]:
                raise ValueError(f"action of {agent!r} must have shape {buffer.shape[1:]}, "
                                 f"got {value.shape}")
            buffer[self._index[agent]] = value
        _, rewards, terminals, truncations, _ = self._env.step(buffer)
        self._returns += rewards
        self._length += 1
        ended = bool(terminals.any() or truncations.any())   # rows end with their instance
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

    # ---- drawing ----------------------------------------------------------------
    def _can_draw(self) -> bool:
        return self._renderer is not None

    def _render_fps(self) -> int | None:
        return None if self._renderer is None else drawing.render_fps(self._renderer)

    def frame(self) -> np.ndarray:
        """The instance's frame now, RGB uint8 (the renderer's rgb_frame)."""
        return drawing.frame(self._renderer, self._env, 0, self.render_size)

    def render(self) -> np.ndarray | None:
        """The current state as an RGB array (render_mode "rgb_array"); shown in
        a window and None ("human"); None with a warning without a render_mode."""
        if self.render_mode is None or not self._can_draw():
            logger.warn(f"render() called without a render_mode (or a renderer); pass "
                        f"render_mode='rgb_array' (or 'human') to {self.metadata['name']}'s "
                        f"parallel_env")
            return None
        frame = self.frame()
        if self.render_mode == "rgb_array":
            return frame
        if self._window is None:
            self._window = Window(f"{self.metadata['name']}")
        self._window.show(frame)
        return None

    # ---- the global state (PettingZoo's state() / state_space) ----------------------------
    def state(self) -> np.ndarray:
        """The env's global state (ENV_GLOBAL_STATE in its header), float32
        [state_dim]. After the step that ended an episode it is the state the
        episode ended on, like the observations that step returned."""
        batch = self._env
        if batch.single_state_space is None:
            raise AttributeError(f"{self.metadata['name']} has no global state")
        ended = bool(batch.terminals[0] or batch.truncations[0])   # cleared by reset
        return (batch.final_states if ended else batch.states)[0].copy()

    def close(self) -> None:
        if self._window is not None:
            self._window.close()
            self._window = None
        self._env.close()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_window"] = None   # a window belongs to the process that opened it
        return state


class Window:
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
