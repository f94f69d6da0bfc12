"""What every vector backend shares: the native batch interface over its buffers."""
from __future__ import annotations

import numpy as np
from gymnasium.vector.utils import batch_space

from ..envs.native.batch import check_action_array
from .common import BUFFER_NAMES, Buffers, buffers_layout, check_count
from .spaces import action_high


class VectorBase:
    """Spaces, buffers and the action check of a vector env.

    Subclasses call `_setup(facts, num_envs, batch_size)` then provide
    reset/step/episode_stats/close; `send`/`recv`/`async_reset` default to
    the synchronous loop.
    """

    def _setup(self, recipe, facts, num_envs, num_workers, batch_size):
        self.recipe = recipe
        self.num_envs = check_count("num_envs", num_envs)
        self.num_workers = check_count("num_workers", num_workers)
        envs_per_unit = facts["envs_per_unit"]
        if self.num_envs % self.num_workers:
            raise ValueError(f"num_envs ({self.num_envs}) must be divisible by num_workers "
                             f"({self.num_workers}): every worker runs the same number of envs")
        self.envs_per_worker = self.num_envs // self.num_workers
        if self.envs_per_worker % envs_per_unit:
            raise ValueError(f"each worker's envs ({self.envs_per_worker}) must be a multiple of "
                             f"the {envs_per_unit} instances your callable's env holds")
        if batch_size is None:
            batch_size = self.num_envs
        batch_size = check_count("batch_size", batch_size)
        if batch_size > self.num_envs or batch_size % self.envs_per_worker:
            raise ValueError(f"batch_size ({batch_size}) must be a multiple of the envs per "
                             f"worker ({self.envs_per_worker} = num_envs / num_workers) and at "
                             f"most num_envs ({self.num_envs})")
        self.batch_size = batch_size
        self.workers_per_batch = batch_size // self.envs_per_worker
        self.envs_per_unit = envs_per_unit
        self.agents_per_env = facts["agents_per_env"]
        self.num_agents = self.num_envs * self.agents_per_env
        self.rows_per_worker = self.envs_per_worker * self.agents_per_env
        self.single_observation_space = facts["single_observation_space"]
        self.single_action_space = facts["single_action_space"]
        layout = buffers_layout(self.num_agents, self.single_observation_space,
                                self.single_action_space)
        Buffers.check_fits(layout)   # before batch_space, which allocates per row too
        self.observation_space = batch_space(self.single_observation_space, self.num_agents)
        self.action_space = batch_space(self.single_action_space, self.num_agents)
        self.stat_names = facts["stat_names"]
        # An emulated env's own observation space (Dict, Tuple, images) that each flat
        # row encodes (spaces.unflatten); None for native envs, whose rows are the space.
        self.structured_observation_space = facts["structured_observation_space"]
        self.name = recipe.name
        self.config = facts["config"]  # the resolved env config (registered envs)
        self._action_shape = (self.num_agents, *self.single_action_space.shape)
        self._action_dtype = np.dtype(self.single_action_space.dtype)
        action_space = self.single_action_space
        # Discrete actions are checked as unsigned integers of their width:
        # negatives become huge, so one comparison against the highest valid
        # value catches both ends.
        self._action_unsigned = np.dtype(f"u{self._action_dtype.itemsize}")
        high = action_high(action_space)
        self._action_high = None if high is None else high.astype(self._action_unsigned)
        return layout

    def _enable_exact_state(self):
        """For native envs: seed_streams/get_state/set_state, as on a native batch
        (the trainer's exact resume looks for them). Instance attributes, so
        hasattr() is False for emulated envs, which cannot offer them."""
        if self.recipe.is_native:
            self.seed_streams = self._seed_streams
            self.get_state = self._get_state
            self.set_state = self._set_state

    def _locate(self, instance):
        if isinstance(instance, bool) or not isinstance(instance, (int, np.integer)) \
                or not 0 <= instance < self.num_envs:
            raise IndexError(f"instance {instance!r} out of range [0, {self.num_envs})")
        return divmod(int(instance), self.envs_per_worker)

    def _bind(self, buffers: Buffers):
        self.buffers = buffers
        for name in BUFFER_NAMES:
            setattr(self, name, getattr(buffers, name))

    def _check_actions(self, actions, rows: int):
        """Refuses actions that do not fit `rows` rows of the action space."""
        check_action_array(actions, self._action_dtype, (rows, *self._action_shape[1:]))
        high = self._action_high
        if high is not None and actions.size:
            as_unsigned = actions.view(self._action_unsigned)
            if (as_unsigned.max() > high) if high.ndim == 0 else (as_unsigned > high).any():
                bad = tuple(np.argwhere(as_unsigned > high)[0])
                allowed = int(high) if high.ndim == 0 else high.tolist()
                raise ValueError(f"action {actions[bad]} in row {bad[0]} is out of range: "
                                 f"expected 0..{allowed}")

    # ---- lifetime ---------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"{type(self).__name__}({self.recipe.name!r}, num_envs={self.num_envs}, "
                f"num_workers={self.num_workers}, batch_size={self.batch_size})")
