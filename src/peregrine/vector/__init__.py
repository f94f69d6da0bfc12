"""Running many env batches: native threads, Serial, Multiprocessing; emulation; export.

    import numpy as np, peregrine.vector as pv

    if __name__ == "__main__":      # worker processes are spawned: a script needs the guard
        env = pv.make("cartpole", backend="multiprocessing", num_envs=1024, num_workers=2,
                      seed=0)
        observations, _ = env.reset()
        observations, rewards, terminals, truncations, _ = env.step(
            np.zeros(env.num_agents, np.int32))
        env.close()

Every backend returns the interface of a native batch (see
peregrine/envs/native/batch.py): in-place row buffers, same-step auto-reset with
`final_observations`, separate terminals and truncations, `masks`,
`episode_stats()`, `close()` and context management; Multiprocessing adds
`async_reset()`, `send(actions)` and `recv()` for batch_size < num_envs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..envs.registry import env_class
from .common import check_count, resolve_seed
from .emulation import GymnasiumEmulation, PettingZooEmulation, emulate
from .export import GymnasiumEnv, GymnasiumVectorEnv, gymnasium_vector_env, sb3_vec_env
from .processes import Multiprocessing, WorkerDiedError, WorkerError, WorkerTimeoutError
from .recipe import EnvRecipe
from .serial import Serial
from .sources import EnvFactory, EnvSourceError, is_native_name
from .spaces import unflatten

if TYPE_CHECKING:
    from ..envs.native.batch import NativeEnv

BACKENDS = ("native", "serial", "multiprocessing")


def make(env: str | Callable[[], Any], backend: str | None = None, num_envs: int = 1, num_workers: int = 1,
         batch_size: int | None = None, num_threads: int = 1, seed: int | None = None, *,
         overwork: bool = False, start_method: str = "spawn", timeout: float | None = None,
         **config: Any) -> NativeEnv | Serial | Multiprocessing:
    """A vector env of `num_envs` envs of `env`.

    env: a registered native env name; any other env name of
        `peregrine.vector.sources` (gym:ID, gym-vec:ID, pettingzoo:MODULE,
        module:function; gym-vec:ID makes one vector env of num_envs / num_workers
        envs per worker unless its own num_envs is given),
        made with **config as its keyword arguments (and `wrappers=[...]`); or a
        zero-arg callable returning a Gymnasium env, a PettingZoo ParallelEnv or a
        native Peregrine env.
        num_envs counts env instances: a callable returning a native batch
        of M instances is called num_envs / M times (its results are copied
        into the shared rows; pass the name instead for zero-copy).
    backend: "native" (one native batch, its C loop split over `num_threads`
        threads; names only), "serial" (blocks stepped in this process) or
        "multiprocessing" (one process per worker over shared memory).
        Default: "native" for a name, "serial" for a callable.
    num_workers: blocks/processes; must divide num_envs. More workers than
        cores warns (CoresWarning) unless overwork=True.
    batch_size: envs per recv() (Multiprocessing); a multiple of
        num_envs / num_workers; default num_envs (synchronous).
    num_threads: threads of each native batch (per worker: hierarchical).
    seed: same seed and actions -> same results, for every backend split the
        same way (Serial and Multiprocessing with equal num_workers agree
        bit for bit; block b of a native env is seeded with seed + b*φ, so
        one block reproduces the plain native env).
    start_method: "spawn" (default) or "forkserver"; "fork" only if you know
        nothing in the parent holds threads or locks.
    timeout: Multiprocessing only: seconds a step/reset may go unanswered
        before its workers count as hung (WorkerTimeoutError; they are killed
        and the env closed). Default None: wait as long as it takes.
    **config: the env's config fields (and preset=) for a registered name.
    """
    if isinstance(env, str) and not is_native_name(env):
        env, config = EnvFactory.from_keywords(env, config), {}
    if backend is None:
        backend = "native" if isinstance(env, str) else "serial"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if timeout is not None and backend != "multiprocessing":
        raise ValueError(f"timeout applies to backend 'multiprocessing' only, not {backend!r}")
    num_envs = check_count("num_envs", num_envs)
    num_workers = check_count("num_workers", num_workers)
    num_threads = check_count("num_threads", num_threads)
    if seed is not None:
        seed = resolve_seed(seed)
    if (isinstance(env, EnvFactory) and env.kind == "gymnasium_vector"
            and "num_envs" not in env.kwargs and num_envs % num_workers == 0):
        # gym-vec: without its own num_envs: one vector env of a block's envs per worker
        env = env.vector_envs_of(num_envs // num_workers)
    if backend == "native":
        if not isinstance(env, str):
            raise ValueError("backend 'native' needs a registered env name; use 'serial' or "
                             "'multiprocessing' for a callable")
        if num_workers != 1 or batch_size not in (None, num_envs):
            raise ValueError("backend 'native' has no workers or batches: use num_threads, or "
                             "backend='multiprocessing' for num_workers/batch_size")
        return env_class(env)(num_envs=num_envs, seed=seed, num_threads=num_threads, **config)
    recipe = EnvRecipe(env, num_threads=num_threads, config=config)
    if backend == "serial":
        return Serial(recipe, num_envs, num_workers, batch_size, seed)
    return Multiprocessing(recipe, num_envs, num_workers, batch_size, seed,
                           overwork=overwork, start_method=start_method, timeout=timeout)


__all__ = ["make", "BACKENDS", "Serial", "Multiprocessing", "EnvRecipe", "WorkerError",
           "WorkerDiedError", "WorkerTimeoutError", "GymnasiumEmulation", "PettingZooEmulation",
           "emulate", "unflatten", "EnvFactory", "EnvSourceError", "GymnasiumEnv", "GymnasiumVectorEnv", "gymnasium_vector_env",
           "sb3_vec_env"]
