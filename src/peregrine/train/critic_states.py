"""The global state column of a centralised critic (`policy.critic = "global" | "state"`).

A multi-agent env may write one global state per instance (the env contract,
envs/native/batch.py: `enable_states()`, `states`, `final_states`). The critic
reads it per *row*: row r is agent r % agents_per_env of instance
r // agents_per_env, so each row's column is its instance's state, followed for
"global" by a one-hot of the agent's index (the policy appends the row's own
observation: MAPPO's agent-specific global state, policy.py says why).

`CriticStates` is the trainer's one reader of those buffers, on every path:
it writes each step's column into the rollout storage (`write`), and builds
the columns for the truncated rows' bootstrap (`final`, from the states the
episodes ended on) and for the last value of a rollout (`current`). The
env's buffers are NumPy arrays (host batch) or tensors on the trainer's device
(device batch); either way the copies here are device ops on views, with no
host synchronisation.
"""
from __future__ import annotations

import numpy as np
import torch

from ..envs.native.protocols import GlobalState


def _tensor(buffer) -> torch.Tensor:
    return torch.from_numpy(buffer) if isinstance(buffer, np.ndarray) else buffer


def global_state_width(env, kind: str) -> int:
    """Width of the critic's state column for `env` and `policy.critic` = kind
    (0 for "local"); ValueError naming the setting when the env has no state."""
    if kind == "local":
        return 0
    state_dim = int(env.state_dim or 0) if isinstance(env, GlobalState) else 0
    if not state_dim:
        raise ValueError(f"policy.critic = {kind!r} needs an env batch that writes a global "
                         f"state (env.enable_states(), e.g. DroneSwarm on vec.backend native "
                         f"or device); this env has none (a Gymnasium or PettingZoo env gives "
                         f"none: PettingZoo's state() is not read; a batch of your own can, "
                         f"with the GlobalState protocol): use policy.critic = 'local'")
    return state_dim + (int(env.agents_per_env) if kind == "global" else 0)


class CriticStates:
    """The critic's state column for the rows of `env` (module docstring); enables
    the env's global state."""

    def __init__(self, env, kind: str, device):
        self.width = global_state_width(env, kind)
        env.enable_states()
        self.device = torch.device(device)
        self.states, self.final_states = _tensor(env.states), _tensor(env.final_states)
        self.num_envs, self.state_dim = int(env.num_envs), int(env.state_dim)
        self.agents = int(env.agents_per_env)
        self.rows = self.num_envs * self.agents
        # constant per row: the agent's index, one-hot ("global"), or nothing ("state")
        self.ids = None
        if kind == "global":
            self.ids = torch.eye(self.agents, device=self.device).repeat(self.num_envs, 1)
        # The bootstrap's column, rebuilt in place: the device pipeline asks for it at
        # every step, and its value is read at once.
        self._final = torch.empty(self.rows, self.width, device=self.device)

    def _fill(self, out: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """out [rows, width] <- each row's instance state (and agent id)."""
        out[:, :self.state_dim].view(self.num_envs, self.agents, self.state_dim).copy_(
            states.unsqueeze(1), non_blocking=True)
        if self.ids is not None:
            out[:, self.state_dim:].copy_(self.ids)
        return out

    def write(self, storage, step: int) -> None:
        """This step's column into storage row `step`."""
        self._fill(storage.critic_states[step], self.states)

    def current(self) -> torch.Tensor:
        """The column of every row's current state: [rows, width]."""
        return self._fill(torch.empty(self.rows, self.width, device=self.device), self.states)

    def final(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The column of the states the rows' episodes ended on (valid on rows that
        just ended): every row, or the rows of the index tensor `rows`."""
        column = self._fill(self._final, self.final_states)
        return column if rows is None else column[rows]
