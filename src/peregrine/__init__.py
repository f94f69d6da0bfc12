"""Peregrine: reinforcement learning built for throughput.

    import numpy as np, peregrine
    env = peregrine.make("cartpole", num_envs=4096, seed=0)
    obs, _ = env.reset()
    obs, rewards, terminals, truncations, _ = env.step(
        np.random.randint(0, 2, env.num_agents, dtype=np.int32))

Gymnasium's API: gymnasium.make("peregrine/CartPole-v1") (one env) and
gymnasium.make_vec("peregrine/CartPole-v1", num_envs=4096) (the native batch).
"""
from .envs.registry import list_envs, make, register_gymnasium_envs_on_import

register_gymnasium_envs_on_import()  # gymnasium.make("peregrine/CartPole-v1") and friends

__version__ = "0.1.0"
__all__ = ["make", "list_envs", "get_include", "__version__"]


def get_include() -> str:
    """The folder of the C SDK headers (pg_env.h and what it needs), for building an
    env header outside Peregrine's source tree, as numpy.get_include()."""
    from .envs.sdk import get_include as include
    return include()
