"""The `gpu` CartPole variant (configs/cartpole-gpu.toml): envs on the training device, and a
recipe that solves in few updates. Its steps to solve are a measurement, not a test (fresh
seeds 1-10 solve in 13-24 updates on the CPU, 25 s a seed here; benchmarks/RESULTS.md, "GPU
second light"); the GPU acceptance's stage c trains it to 475 on five seeds, and its dry run
(tests/test_gpu_acceptance.py) trains it here."""
from __future__ import annotations

from peregrine.train.config import load_config, shipped_variants


def test_gpu_variant_is_shipped_and_layers_over_cartpole():
    assert "gpu" in shipped_variants("cartpole")
    config = load_config("cartpole", "gpu")
    base = load_config("cartpole")
    assert config.vec.backend == "device"
    assert config.train.stop_return == base.train.stop_return == 475.0   # from cartpole.toml
    # the per-update launch count the recipe is tuned for: few optimizer steps per update
    minibatches = config.vec.num_envs * config.train.horizon // config.train.minibatch_size
    assert config.train.update_epochs * minibatches <= 16
    assert config.train.ent_coef == 0.0
