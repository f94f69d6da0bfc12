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
of every instance is a row (see docs/clients.md, "PettingZoo").

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

from typing import Any

import numpy as np

from ..native.parallel import NativeParallelEnv
from . import DroneSwarm

class DroneSwarmParallelEnv(NativeParallelEnv):
    """One DroneSwarm instance behind PettingZoo's ParallelEnv API (see module doc):
    the generic native view (envs/native/parallel.py) with DroneSwarm's presets, its
    drone names and its own drawing at `render_size`."""

    agent_prefix = "drone"

    def __init__(self, render_mode: str | None = None, render_size: int = 320,
                 preset: str = "default", max_cycles: int | None = None, **config: Any) -> None:
        super().__init__(DroneSwarm, render_mode=render_mode, render_size=render_size,
                         max_cycles=max_cycles, renderer="peregrine.envs.drone_swarm.render",
                         preset=preset, **config)

    def frame(self) -> np.ndarray:
        from .reference import decode_state
        from .render import draw_frame
        state = decode_state(self._env.get_state(0), self.config)
        return np.asarray(draw_frame(state, self.config, size=self.render_size))

    def state(self) -> np.ndarray:
        """The global state: float32 [state_dim] in `state_space` ([-1, 1]), every
        drone and victim and the time, normalised for learning, for a centralised
        critic (package docstring, "Global state"). After the step that ended an
        episode it is the state the episode ended on, like the observations that step
        returned. The exact simulator state is exact_state()."""
        return super().state()

    def exact_state(self) -> np.ndarray:
        """The instance's exact state (flat float64; layout in the package
        docstring): for debugging and set_state, not for learning."""
        return self._env.get_state(0)


def parallel_env(render_mode: str | None = None, **config) -> DroneSwarmParallelEnv:
    """A DroneSwarm ParallelEnv; keywords are DroneSwarm's config fields, `preset`,
    `render_size` and `max_cycles`."""
    return DroneSwarmParallelEnv(render_mode=render_mode, **config)


def env(render_mode: str | None = None, **config):
    """The AEC version (agents act in turn), as PettingZoo's `env()` is:
    parallel_to_aec over parallel_env(...), same keywords."""
    from pettingzoo.utils.conversions import parallel_to_aec
    return parallel_to_aec(parallel_env(render_mode=render_mode, **config))
