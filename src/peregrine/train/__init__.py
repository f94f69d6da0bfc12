"""PPO training over Peregrine's flat row buffers.

    from peregrine.train import load_config, train
    config = load_config("cartpole", overrides=[("train.total_steps", 50_000)])
    summary = train(config)            # writes runs/cartpole-.../ and returns a summary
    train(config, progress=True)       # the same, printing a progress line every 10 updates

Modules: `config` (TOML sections env/vec/train/policy and overrides), `policy`
(MLP/LSTM with categorical, multi-discrete and Gaussian heads), `ppo` (the
Trainer: one update = rollout -> advantages -> learn), its parts `storage`
(rollout tensors, minibatch views), `observations` (env buffers, normalisers,
mask columns), `kickstart` (teacher), `advantages` (GAE), `loss` (PPO loss,
`LossStats`), `checkpoint` (atomic, verified files;
`load_actor` for evaluation), `run` (run directory, loop, Ctrl-C), `cli`.
Importing this package does not import torch; the functions below do.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .config import Config, load_config

if TYPE_CHECKING:   # checkpoint imports torch, which this package must not
    from .checkpoint import Actor

__all__ = ["Config", "load_config", "train", "load_actor"]


def train(config: Config, run_dir: str | os.PathLike[str] | None = None,
          **kwargs: Any) -> dict:
    """Trains a run (see `run.train` for the keywords); returns its summary."""
    from .run import train as _train
    return _train(config, run_dir, **kwargs)


def load_actor(path: str | os.PathLike[str], env: Any, check_world: bool = True,
               sample_seed: int | None = None) -> Actor:
    """A deterministic actor from a checkpoint, or with `sample_seed` one that samples
    (see `checkpoint.load_actor`)."""
    from .checkpoint import load_actor as _load_actor
    return _load_actor(path, env, check_world, sample_seed)
