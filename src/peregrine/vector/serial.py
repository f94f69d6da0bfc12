"""Serial: every block of envs stepped in turn in this process.

The reference backend: no processes, no shared memory, easiest to debug.
Rows are split into `num_workers` blocks exactly as Multiprocessing splits
them, so for the same seed and actions the two produce identical buffers.
"""
from __future__ import annotations

import numpy as np

from ..envs.native.batch import ResetResult, StepResult
from .base import VectorBase
from .common import Buffers, EpisodeStats, merge_stats, resolve_seed, slice_buffers
from .recipe import EnvRecipe


class Serial(VectorBase):
    """`num_workers` blocks of `num_envs / num_workers` envs, stepped in turn."""

    def __init__(self, recipe: EnvRecipe, num_envs: int, num_workers: int = 1,
                 batch_size: int | None = None, seed: int | None = None) -> None:
        facts = recipe.probe()
        layout = self._setup(recipe, facts, num_envs, num_workers, batch_size)
        if self.batch_size != self.num_envs:
            raise ValueError("Serial steps every env at once: batch_size must equal num_envs "
                             "(use backend='multiprocessing' for asynchronous batches)")
        self._bind(Buffers.allocate(layout))
        self.blocks = []
        try:
            for worker in range(self.num_workers):
                rows = slice_buffers(self.buffers, worker * self.rows_per_worker,
                                     (worker + 1) * self.rows_per_worker)
                self.blocks.append(recipe.build_block(
                    worker, self.envs_per_worker, self.envs_per_unit, self.agents_per_env,
                    rows, seed))
        except BaseException:
            self.close()
            raise
        self._env_ids = np.arange(self.num_envs)
        # One native batch checks its actions itself before any state changes;
        # with several blocks the check must come first, or a bad action in
        # block k would leave blocks 0..k-1 stepped.
        self._check_in_parent = not (recipe.is_native and self.num_workers == 1)
        self._enable_exact_state()

    def reset(self, seed: int | None = None) -> ResetResult:
        if not self.blocks:
            raise RuntimeError("the vector env is closed")
        seed = None if seed is None else resolve_seed(seed)
        for block in self.blocks:
            block.reset(seed)
        return self.observations, {}

    def step(self, actions: np.ndarray) -> StepResult:
        if not self.blocks:
            raise RuntimeError("the vector env is closed")
        if actions is not self.actions:
            if self._check_in_parent:
                self._check_actions(actions, self.num_agents)
            self.actions[...] = actions
        for block in self.blocks:
            block.step()
        return self.observations, self.rewards, self.terminals, self.truncations, {}

    # the asynchronous API, degenerate: every batch is the whole set of envs
    def async_reset(self, seed: int | None = None) -> None:
        self.reset(seed)

    def send(self, actions: np.ndarray) -> None:
        self.step(actions)

    def recv(self) -> tuple:
        return (self.observations, self.rewards, self.terminals, self.truncations, {},
                self._env_ids, self.masks)

    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        return merge_stats(block.episode_stats(clear) for block in self.blocks)

    def _seed_streams(self, seed: int) -> None:
        for block in self.blocks:
            block.seed_streams(seed)

    def _get_state(self, instance: int):
        block, local = self._locate(instance)
        return self.blocks[block].get_state(local)

    def _set_state(self, instance: int, state) -> None:
        block, local = self._locate(instance)
        self.blocks[block].set_state(local, state)

    def close(self) -> None:
        blocks, self.blocks = getattr(self, "blocks", []), []
        for block in blocks:
            block.close()
