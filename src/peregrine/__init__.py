"""Peregrine: reinforcement learning built for throughput.

    import numpy as np, peregrine
    env = peregrine.make("cartpole", num_envs=4096, seed=0)
    obs, _ = env.reset()
    obs, rewards, terminals, truncations, _ = env.step(
        np.random.randint(0, 2, env.num_agents, dtype=np.int32))
"""
from .registry import list_envs, make

__version__ = "0.1.0"
__all__ = ["make", "list_envs", "__version__"]
