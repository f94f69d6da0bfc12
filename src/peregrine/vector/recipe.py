"""What to build in each worker: an EnvRecipe, and the Block of units it builds.

A vector env of `num_envs` instances is split into `num_blocks` equal,
contiguous blocks of rows (one per worker in Multiprocessing; the same split
in Serial, so the two are identical for the same seed). A block holds:

* for a registered native env name, ONE native batch of all its instances,
  writing straight into the block's rows (zero-copy, `num_threads` threads
  each: hierarchical vectorization);
* for a callable, one unit per call (an emulated Gymnasium/PettingZoo env, or
  a copied native batch), each in its own sub-slice of the block's rows.

Seeds: native block b is seeded with unit_seed(seed, b); the k-th call of a
callable (counted over the whole vector env) with unit_seed(seed, k).
"""
from __future__ import annotations

from typing import Any

from ..envs.native.batch import EpisodeStats
from ..envs.native.protocols import ExactState, StructuredRows, env_config
from ..envs.registry import env_class
from .common import merge_stats, unit_seed
from .emulation import emulate


class EnvRecipe:
    """A registered env name plus config, or a zero-arg callable creating one env."""

    def __init__(self, env, num_threads: int = 1, config=None):
        config = dict(config or {})
        if isinstance(env, str):
            self.env_class = env_class(env)  # refuses unknown names, listing the known ones
            self.name = env
        elif callable(env):
            if config:
                raise ValueError(f"config fields {sorted(config)} are only accepted with a "
                                 "registered env name; bind them inside your callable")
            self.env_class = None
            self.name = getattr(env, "__name__", type(env).__name__)
        else:
            raise ValueError(f"env must be a registered env name (str) or a zero-arg callable "
                             f"creating an env, got {type(env).__name__}")
        self.env = env
        self.num_threads = num_threads
        self.config = config
        self._facts = None      # probe()'s answer, learned once

    def __getstate__(self):
        # a worker builds its block from the recipe and never probes: the facts stay here
        return {**self.__dict__, "_facts": None}

    @property
    def is_native(self) -> bool:
        return self.env_class is not None

    def probe(self):
        """The unit facts (spaces, rows per env, envs per unit, stats, config): one small
        unit is created the first time and closed; later calls give the same facts."""
        if self._facts is None:
            self._facts = self._probe_unit()
        return self._facts

    def _probe_unit(self):
        if self.is_native:
            unit = self.env_class(num_envs=1, seed=0, num_threads=1, **self.config)
        else:
            unit = emulate(self.env(), seed=None)
        try:
            return {"single_observation_space": unit.single_observation_space,
                    "single_action_space": unit.single_action_space,
                    "agents_per_env": int(unit.agents_per_env),
                    "envs_per_unit": 1 if self.is_native else int(unit.num_envs),
                    "stat_names": tuple(unit.stat_names),
                    # the env's own (nested, image) observation space the flat rows encode
                    "structured_observation_space": unit.structured_observation_space
                    if isinstance(unit, StructuredRows) else None,
                    "config": env_config(unit) if self.is_native else {}}
        finally:
            unit.close()

    def build_block(self, block_index: int, envs_per_block: int, envs_per_unit: int,
                    agents_per_env: int, buffers, seed):
        """The units of block `block_index`, writing into `buffers` (the block's rows)."""
        if self.is_native:
            unit = self.env_class(num_envs=envs_per_block, seed=unit_seed(seed, block_index),
                                  num_threads=self.num_threads, buffers=buffers, **self.config)
            return Block([unit], [block_index], seed)
        units, indices = [], []
        units_per_block = envs_per_block // envs_per_unit
        rows_per_unit = envs_per_unit * agents_per_env
        try:
            for j in range(units_per_block):
                index = block_index * units_per_block + j
                rows = slice_buffers_from(buffers, j * rows_per_unit, (j + 1) * rows_per_unit)
                units.append(emulate(self.env(), buffers=rows, seed=unit_seed(seed, index),
                                     index=index * envs_per_unit))
                indices.append(index)
        except BaseException:
            for unit in units:
                unit.close()
            raise
        return Block(units, indices, seed)


def slice_buffers_from(buffers: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    return {name: array[start:stop] for name, array in buffers.items()}


class Block:
    """Units stepping in turn over contiguous rows of one set of buffers.

    A reset without a seed before any step plays the construction seed's first
    episodes again (`vector.make(..., seed=s).reset()` is `reset(seed=s)`, as a native
    batch's first reset is); after a step it continues each env's own stream."""

    def __init__(self, units, unit_indices, seed=None):
        self.units = units
        self.unit_indices = unit_indices
        self.seed = seed
        self.stepped = False

    def reset(self, seed=None):
        if seed is None and not self.stepped:
            seed = self.seed
        self.stepped = False
        for unit, index in zip(self.units, self.unit_indices):
            unit.reset(seed=unit_seed(seed, index))

    def step(self):
        """Steps every unit with the actions already in its rows."""
        self.stepped = True
        for unit in self.units:
            unit.step(unit.actions)

    def episode_stats(self, clear: bool = True) -> EpisodeStats:
        return merge_stats(unit.episode_stats(clear) for unit in self.units)

    # ---- exact state (native blocks only: one native batch per block) ------------
    def _native(self):
        if len(self.units) != 1 or not isinstance(self.units[0], ExactState):
            raise ValueError("exact state is only available for registered native envs")
        return self.units[0]

    def seed_streams(self, seed: int) -> None:
        """Re-derives every instance's random stream without resetting."""
        unit = self._native()
        unit._batch.seed(unit_seed(seed, self.unit_indices[0]))

    def get_state(self, instance: int):
        return self._native().get_state(instance)

    def set_state(self, instance: int, state) -> None:
        self._native().set_state(instance, state)

    def close(self):
        units, self.units = self.units, []
        for unit in units:
            unit.close()


__all__ = ["EnvRecipe", "Block"]
