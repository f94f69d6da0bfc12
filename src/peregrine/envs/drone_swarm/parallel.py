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
holds the episode statistics (return, length, delivered, ...).

Actions: a dict holding every agent of `agents`, each a 3-vector (vx, vy, scan)
in [-1, 1] (the native rules clamp; NaN/inf become 0). A missing or unknown
agent, or a value of another shape, is a ValueError naming it.

Render: `render_mode="rgb_array"` returns a top-down frame (uint8 [H, W, 3],
see render.py) of the current state; `render_size` sets H = W (default 320).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import logger, spaces
from pettingzoo import ParallelEnv

from . import DroneSwarm

RENDER_MODES = ("rgb_array",)


class DroneSwarmParallelEnv(ParallelEnv):
    """One DroneSwarm instance behind PettingZoo's ParallelEnv API (see module doc)."""

    metadata = {"name": "drone_swarm_v0", "render_modes": list(RENDER_MODES),
                "is_parallelizable": True, "render_fps": 10}

    def __init__(self, render_mode: str | None = None, render_size: int = 320,
                 preset: str = "default", **config: Any) -> None:
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode must be None or one of {list(RENDER_MODES)}, "
                             f"got {render_mode!r}")
        if isinstance(render_size, bool) or not isinstance(render_size, int) or render_size < 32:
            raise ValueError(f"render_size must be an int >= 32, got {render_size!r}")
        self.render_mode = render_mode
        self.render_size = render_size
        self._env = DroneSwarm(num_envs=1, preset=preset, **config)
        self.config = self._env.config
        self.possible_agents = [f"drone_{i}" for i in range(self._env.agents_per_env)]
        self.agents: list[str] = []
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}
        # One space object per agent, returned every time (PettingZoo expects that).
        self.observation_spaces = {agent: self._env.single_observation_space
                                   for agent in self.possible_agents}
        self.action_spaces = {agent: self._env.single_action_space for agent in self.possible_agents}
        # The global state (see `state`): one instance, so writing it costs next to nothing.
        self._env.enable_states()
        self.state_space = self._env.single_state_space

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
        self.agents = list(self.possible_agents)
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
        ended = bool(terminals[0] or truncations[0])  # every drone ends with its instance
        rows = self._env.final_observations if ended else self._env.observations
        observations = self._observations(rows)
        reward = {agent: float(rewards[i]) for agent, i in self._index.items()}
        terminated = {agent: bool(terminals[i]) for agent, i in self._index.items()}
        truncated = {agent: bool(truncations[i]) for agent, i in self._index.items()}
        infos: dict[str, dict] = {agent: {} for agent in self.agents}
        if ended:
            episodes, sums = self._env.instance_stats(clear=True)
            if episodes[0] == 1:
                episode = dict(zip(self._env.stat_names, (float(v) for v in sums[0])))
                for agent in self.agents:
                    infos[agent]["episode"] = dict(episode)
            self.agents = []
        return observations, reward, terminated, truncated, infos

    def render(self) -> np.ndarray | None:
        """The current state as an RGB array (render_mode "rgb_array"), else None."""
        if self.render_mode is None:
            logger.warn("render() called without a render_mode; pass render_mode='rgb_array' "
                        "to drone_swarm.parallel_env")
            return None
        from .reference import decode_state
        from .render import draw_frame
        state = decode_state(self._env.get_state(0), self.config)
        return np.asarray(draw_frame(state, self.config, size=self.render_size))

    def state(self) -> np.ndarray:
        """The global state: float32 [state_dim] in `state_space` ([-1, 1]), every
        drone and victim and the time, normalised for learning (layout in the
        package docstring, "Global state"), for a centralised critic. After the
        step that ended an episode it is the state the episode ended on, like the
        observations that step returned. (The exact float64 snapshot of the
        instance is `env.unwrapped._env.get_state(0)`.)"""
        batch = self._env
        ended = bool(batch.terminals[0] or batch.truncations[0])   # cleared by reset
        return (batch.final_states if ended else batch.states)[0].copy()

    def close(self) -> None:
        self._env.close()


def parallel_env(render_mode: str | None = None, **config) -> DroneSwarmParallelEnv:
    """A DroneSwarm ParallelEnv; keywords are DroneSwarm's config fields and `preset`."""
    return DroneSwarmParallelEnv(render_mode=render_mode, **config)
