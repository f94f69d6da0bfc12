"""Steady-state throughput of the three things worth timing separately.

* ``env_only``: the native batch stepped with random actions (one C call per
  step; the actions are sampled before the clock starts), so the figure is the
  env's own cost.
* ``trainer``: full PPO updates (rollout + GAE + learning) through the
  trainer's public API, ``peregrine.train.ppo.Trainer(config).update()``.
* ``trainer_eval``: the same, plus an evaluation every ``eval_interval``
  updates (``peregrine.evaluate.evaluate`` of the current policy), to show
  what periodic evaluation costs the training throughput.

Each mode runs a unit of work repeatedly: first for ``warmup`` seconds, which
are discarded (allocator, caches, torch's lazy initialisation, CPU frequency),
then for ``seconds``, timing every unit. The headline figure is total steps
over total measured time; the per-unit rates give the spread (min, median,
max, coefficient of variation) so a noisy run is visible as such.

"Steps" are agent rows, the same unit as the trainer's SPS and ``global_step``
(for single-agent envs, env steps).

Every mode also reports ``resources`` (train/resources.py): the process's peak
resident memory (the whole profile, imports and set-up included) and that of
every process it started (Multiprocessing workers), CPU utilisation over the
measured seconds, and on CUDA the GPU's utilisation and memory through NVML.
"""
from __future__ import annotations

import statistics
import time

from ..envs.native.protocols import env_config

MODES = ("env_only", "trainer", "trainer_eval")


class TrainerUnavailable(RuntimeError):
    """The trainer (peregrine.train, torch) cannot be imported."""


def _loop(unit, seconds: float, minimum_units: int = 1):
    """Runs `unit()` (-> (steps, split)) for `seconds`; returns per-unit timings."""
    timings = []
    start = time.perf_counter()
    now = start
    while now - start < seconds or len(timings) < minimum_units:
        steps, split = unit()
        later = time.perf_counter()
        timings.append((steps, later - now, split))
        now = later
    return timings, now - start


def summarize(warmup, measured, elapsed_measured, elapsed_warmup) -> dict:
    steps = sum(t[0] for t in measured)
    rates = [t[0] / t[1] for t in measured if t[1] > 0]
    split: dict[str, float] = {}
    for _, _, unit_split in measured:
        for name, seconds in unit_split.items():
            split[name] = split.get(name, 0.0) + seconds
    accounted = sum(split.values())
    split["other"] = max(elapsed_measured - accounted, 0.0)
    mean = statistics.fmean(rates) if rates else 0.0
    return {
        "steady_state": {
            "steps_per_sec": steps / elapsed_measured if elapsed_measured > 0 else 0.0,
            "steps": steps,
            "seconds": elapsed_measured,
            "units": len(measured),
            "unit_steps_per_sec": {
                "min": min(rates) if rates else 0.0,
                "median": statistics.median(rates) if rates else 0.0,
                "max": max(rates) if rates else 0.0,
                "cv": statistics.pstdev(rates) / mean if len(rates) > 1 and mean > 0 else 0.0,
            },
        },
        "warmup": {"seconds": elapsed_warmup, "steps": sum(t[0] for t in warmup), "units": len(warmup)},
        "time_split_seconds": split,
        "time_split_fraction": {name: (value / elapsed_measured if elapsed_measured > 0 else 0.0)
                                for name, value in split.items()},
    }


def measured_resources(probe) -> dict:
    """The probe's figures over the span since its previous sample (no time to
    first result: a profile has no first result of a run)."""
    figures = probe.sample()
    figures.pop("time_to_first_result", None)
    return figures


def profile_env_only(env_name: str, seconds: float, warmup: float, num_envs: int = 4096,
                     num_threads: int = 1, seed: int = 0, **config) -> dict:
    from ..envs.registry import make
    from ..train.resources import ResourceProbe
    from ..vector.sources import is_native_name
    from .bench import action_pool

    if is_native_name(env_name):
        env = make(env_name, num_envs=num_envs, seed=seed, num_threads=num_threads, **config)
    else:   # emulated: Multiprocessing, one worker per core, as the trainer runs it
        from .. import vector
        from ..vector.common import auto_workers
        env = vector.make(env_name, backend="multiprocessing", num_envs=num_envs,
                          num_workers=auto_workers(num_envs), seed=seed, **config)
    try:
        env.reset(seed=seed)
        pool = action_pool(env, 16, seed)
        rows = env.num_agents

        def unit():
            tick = time.perf_counter()
            for actions in pool:
                env.step(actions)
            return rows * len(pool), {"env": time.perf_counter() - tick}

        probe = ResourceProbe()
        warm, warm_elapsed = _loop(unit, warmup)
        probe.sample()                              # CPU counts from here
        measured, elapsed = _loop(unit, seconds)
        result = summarize(warm, measured, elapsed, warm_elapsed)
        result["resources"] = measured_resources(probe)
        result["steady_state"]["env_steps_per_sec"] = \
            result["steady_state"]["steps_per_sec"] / env.agents_per_env
        result["setup"] = {"num_envs": num_envs, "num_threads": num_threads,
                           "agents_per_env": env.agents_per_env, "rows": rows, "seed": seed,
                           "steps_per_unit": rows * len(pool),
                           "env_config": env_config(env)}
        return result
    finally:
        env.close()


def load_trainer():
    """(load_config, Trainer, Actor, evaluate) from the trainer's public API."""
    try:
        from ..evaluate import evaluate
        from ..train import load_config
        from ..train.checkpoint import Actor
        from ..train.ppo import Trainer
    except ImportError as error:
        raise TrainerUnavailable(f"trainer not available ({error}); only --mode env_only works "
                                 "in this installation") from None
    return load_config, Trainer, Actor, evaluate


def profile_trainer(env_name: str, seconds: float, warmup: float, overrides=(),
                    evaluate_every: int = 0, eval_episodes: int = 16, seed: int = 0) -> dict:
    """Times `Trainer.update()`; with `evaluate_every` > 0 also an evaluation
    of the current policy every that many updates (time under "eval")."""
    load_config, Trainer, Actor, evaluate = load_trainer()
    from ..train.resources import ResourceProbe
    # Training never ends inside the profile, and the LR schedule stays near its start.
    config = load_config(env_name, overrides=[("train.total_steps", 10 ** 15), ("train.seed", seed),
                                              *overrides])
    env_fields = {key: value for key, value in config.env.items() if key != "name"}
    trainer = Trainer(config)
    try:
        counter = {"updates": 0, "evaluations": 0}

        def unit():
            record = trainer.update()
            split = {name: float(record["time_split"].get(name, 0.0)) for name in ("env", "forward", "learn")}
            counter["updates"] += 1
            if evaluate_every and counter["updates"] % evaluate_every == 0:
                tick = time.perf_counter()
                actor = Actor(trainer.policy, trainer.env.single_action_space,
                              obs_normalizer=trainer.pipeline.obs_norm,
                              mask_slice=trainer.pipeline.mask_slice)
                # in the run's own world: the trainer's [env] section
                result = evaluate(env_name, actor, episodes=eval_episodes,
                                  seed=seed + counter["evaluations"], **env_fields)
                counter["eval_env_config"] = result["env_config"]
                split["eval"] = time.perf_counter() - tick
                counter["evaluations"] += 1
            return trainer.batch_size, split

        probe = ResourceProbe(trainer.device)
        warm, warm_elapsed = _loop(unit, warmup, minimum_units=1)
        counter["evaluations"] = 0
        probe.sample()                              # CPU counts from here
        measured, elapsed = _loop(unit, seconds, minimum_units=max(1, evaluate_every))
        result = summarize(warm, measured, elapsed, warm_elapsed)
        result["resources"] = measured_resources(probe)
        t = config.train
        result["setup"] = {
            "num_envs": config.vec.num_envs, "num_threads": config.vec.num_threads,
            "backend": config.vec.backend, "rows": trainer.rows, "horizon": trainer.horizon,
            "batch_size": trainer.batch_size, "minibatch_size": t.minibatch_size,
            "update_epochs": t.update_epochs, "device": str(trainer.device),
            "torch_threads": trainer.torch_threads, "seed": seed, "overrides": [list(o) for o in overrides],
            "steps_per_unit": trainer.batch_size,
            "evaluate_every": evaluate_every, "eval_episodes": eval_episodes if evaluate_every else 0,
            "evaluations": counter["evaluations"],
            "eval_env_config": counter.get("eval_env_config"),
            "env_config": env_config(trainer.env),
        }
        return result
    finally:
        trainer.close()
