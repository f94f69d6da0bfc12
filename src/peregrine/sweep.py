"""Hyperparameter sweeps on Optuna: `peregrine sweep SWEEP.toml`.

A sweep file names the env and the config it varies, the values fixed for every
trial (the config's own sections, layered over the base config), and a `[sweep]`
table with the search space:

    [sweep]
    env = "cartpole"
    config = "fast"              # optional: a shipped variant or a TOML file
    trials = 20                  # COMPLETE + PRUNED trials to reach
    seeds = [1, 2, 3]            # training seeds of every trial
    objective = "median"         # median | worst | mean of the seeds' metric
    metric = "episode_return"    # an evaluation statistic (its mean over episodes)
    direction = "maximize"
    eval_episodes = 32
    eval_seed = 0
    sampler = "tpe"              # tpe | random, or { name = "tpe", seed = 1, ... }
    pruner = "median"            # median | none, or { name = "median", n_warmup_steps = ... }
    enqueue = [{ "train.learning_rate" = 5e-3 }]   # optional: trials to run first

    [sweep.params]
    "train.learning_rate" = { log_uniform = [1e-4, 1e-2] }
    "train.gamma" = { uniform = [0.9, 0.999] }
    "train.update_epochs" = { int = [2, 10] }
    "policy.activation" = { choice = ["tanh", "relu"] }

    [train]                      # fixed for every trial
    total_steps = 50_000

A trial trains one run per seed (through `peregrine.train.run.train`, into
SWEEP_DIR/trials/NNNN/seed-S), evaluates each checkpoint in its trained world
(`peregrine.evaluate.evaluate`) and returns the objective over the seeds, so
what gets optimised is the distribution, not the lucky seed. While a seed trains,
its recent return (or the metric's per-update value) is reported to the trial
at step = seeds already trained x train.total_steps + the run's global step, so
the pruner compares trials at the same point of their budget (the pruner's
`n_warmup_steps` is in these units).

The study lives in a database (default sqlite:///SWEEP_DIR/study.db; any
SQLAlchemy URL). Trials run in `jobs` worker processes, one per core. Running
the same command again continues the study: finished trials are kept; a trial
left RUNNING by a killed sweep on this machine (its process is gone) is marked
FAIL at startup and not counted (trials on other machines sharing the storage
are failed by Optuna's heartbeat once stale); new trials are asked for until
COMPLETE + PRUNED reaches `trials`. Each completed trial rewrites
SWEEP_DIR/best.toml (a config variant: `peregrine train ENV --config best.toml`);
the end of the sweep also writes every trial to SWEEP_DIR/trials.csv and saves
the study's plots as PNG.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from .files import written_atomically
from .monitor.metrics import pid_alive
from .train.config import SECTIONS, dump_toml, load_config, read_toml, resolve_config_file

OBJECTIVES = ("median", "worst", "mean")
DIRECTIONS = ("maximize", "minimize")
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler"}
PRUNERS = {"median": "MedianPruner", "none": "NopPruner"}
DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice")
# Keys a distribution table may hold besides its kind: which kinds take them.
DISTRIBUTION_OPTIONS = {"step": ("uniform", "int"), "log": ("int",)}
SWEEP_KEYS = {"env", "config", "name", "trials", "seeds", "objective", "metric", "direction",
              "eval_episodes", "eval_seed", "storage", "sampler", "pruner", "params", "enqueue"}
# Optuna's heartbeat: a RUNNING trial whose process stopped beating for
# HEARTBEAT_GRACE seconds is failed by whichever worker asks for a trial next.
HEARTBEAT_INTERVAL = 30
HEARTBEAT_GRACE = 120
COUNTED = ("COMPLETE", "PRUNED")


class SweepError(ValueError):
    """A problem with the sweep itself (its file or storage): refused before training."""


class MetricError(Exception):
    """The metric is not a statistic of the env: stops the sweep (not one trial's
    failure, which the worker would otherwise retry with other parameters)."""


@dataclasses.dataclass
class Sweep:
    """A sweep file, checked: everything a worker process needs (picklable)."""
    path: str
    env: str
    config: str | None                  # the base config file (resolved), or None
    fixed: dict[str, dict[str, Any]]    # sections fixed for every trial
    params: dict[str, dict[str, Any]]   # "section.key" -> distribution table
    name: str
    trials: int
    seeds: list[int]
    objective: str
    metric: str
    direction: str
    eval_episodes: int
    eval_seed: int
    storage: str
    sampler: dict[str, Any]             # {"name": ..., options}
    pruner: dict[str, Any]
    enqueue: list[dict[str, Any]]
    directory: str

    def fixed_overrides(self) -> list[tuple[str, Any]]:
        return [(f"{section}.{key}", value) for section, values in self.fixed.items()
                for key, value in values.items()]

    def trial_config(self, params: dict[str, Any], seed: int):
        """The config of one seed of a trial: base config, fixed values, the trial's
        parameters, the seed, one torch thread (trials run one per core)."""
        overrides = self.fixed_overrides() + list(params.items())
        overrides += [("train.seed", seed), ("train.torch_threads", 1)]
        return load_config(self.env, self.config, overrides)

    def signature(self) -> str:
        """What makes two runs of a sweep file the same study (not `trials`: a sweep
        may be extended; the base config by its values, wherever the command runs)."""
        fields = {k: getattr(self, k) for k in (
            "env", "fixed", "params", "seeds", "objective", "metric", "direction",
            "eval_episodes", "eval_seed")}
        fields["config"] = read_toml(self.config) if self.config else None
        return json.dumps(fields, sort_keys=True, default=str)


# ---- reading a sweep file -------------------------------------------------------

def load_sweep(path: str | os.PathLike[str], directory: str | os.PathLike[str] | None = None,
               trials: int | None = None) -> Sweep:
    """Reads and checks a sweep file (SweepError naming the problem). `directory`
    (default runs/sweeps/<file stem>) holds the trials' runs, the default storage,
    best.toml and the plots; `trials` overrides the file's count."""
    path = Path(path)
    data = read_toml(path)
    table = data.pop("sweep", None)
    if not isinstance(table, dict):
        raise SweepError(f"sweep file {str(path)!r} has no [sweep] table")
    unknown = sorted(set(table) - SWEEP_KEYS)
    if unknown:
        raise SweepError(f"unknown key(s) {unknown} in [sweep]; valid keys: {sorted(SWEEP_KEYS)}")
    env = table.get("env") or (data.get("env") or {}).get("name")
    if not isinstance(env, str):
        raise SweepError("[sweep] env must name the env to train (e.g. env = \"cartpole\")")
    config = table.get("config")
    if config is not None:
        relative = path.parent / str(config)
        config = str(resolve_config_file(env, relative if relative.is_file() else config))
    unknown = sorted(set(data) - {"env", *SECTIONS})
    if unknown:
        raise SweepError(f"unknown section(s) {unknown} in the sweep file; valid: [sweep] and "
                         f"the config's {['env', *SECTIONS]}")
    fixed = {section: {k: v for k, v in values.items() if (section, k) != ("env", "name")}
             for section, values in data.items() if isinstance(values, dict)}
    directory = Path(directory) if directory is not None else Path("runs") / "sweeps" / path.stem
    sweep = Sweep(
        path=str(path), env=env, config=config, fixed=fixed,
        params=_check_params(table.get("params")), name=str(table.get("name", path.stem)),
        trials=_positive("trials", table.get("trials", 20) if trials is None else trials),
        seeds=_seeds(table.get("seeds", [1])),
        objective=_choice("objective", table.get("objective", "median"), OBJECTIVES),
        metric=str(table.get("metric", "episode_return")),
        direction=_choice("direction", table.get("direction", "maximize"), DIRECTIONS),
        eval_episodes=_positive("eval_episodes", table.get("eval_episodes", 32)),
        eval_seed=_positive("eval_seed", table.get("eval_seed", 0), minimum=0),
        storage=str(table.get("storage") or f"sqlite:///{(directory / 'study.db').resolve()}"),
        sampler=_named("sampler", table.get("sampler", "tpe"), SAMPLERS),
        pruner=_named("pruner", table.get("pruner", "median"), PRUNERS),
        enqueue=_enqueue(table.get("enqueue", [])), directory=str(directory))
    _check_values(sweep)
    return sweep


def _positive(name, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SweepError(f"[sweep] {name} must be an integer >= {minimum}, got {value!r}")
    return value


def _choice(name, value, choices) -> str:
    if value not in choices:
        raise SweepError(f"[sweep] {name} = {value!r} is not one of {list(choices)}")
    return value


def _seeds(value) -> list[int]:
    if not isinstance(value, list) or not value or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
        raise SweepError(f"[sweep] seeds must be a non-empty list of integers >= 0, got {value!r}")
    if len(set(value)) != len(value):
        raise SweepError(f"[sweep] seeds has repeats: {value!r}")
    return list(value)


def _named(what: str, value, known: dict) -> dict[str, Any]:
    """A sampler/pruner: a name, or a table with `name` and the Optuna class's options."""
    options = dict(value) if isinstance(value, dict) else {"name": value}
    if options.get("name") not in known:
        raise SweepError(f"[sweep] {what} {options.get('name')!r} is not one of {list(known)} "
                         f"(or a table {{ name = ..., options }})")
    try:     # the options are the Optuna class's keywords: try them now, not mid-sweep
        _optuna_object(what, options)
    except TypeError as error:
        raise SweepError(f"[sweep] {what} {value!r}: {error}") from None
    return options


def _optuna_object(what: str, options: dict[str, Any]):
    import optuna
    module = optuna.samplers if what == "sampler" else optuna.pruners
    kwargs = {k: v for k, v in options.items() if k != "name"}
    return getattr(module, (SAMPLERS if what == "sampler" else PRUNERS)[options["name"]])(**kwargs)


def _check_params(params) -> dict[str, dict[str, Any]]:
    """[sweep.params]: one distribution table per SECTION.KEY, shapes and bounds
    checked (the keys and values themselves are the config's to check)."""
    if not isinstance(params, dict) or not params:
        raise SweepError("[sweep.params] must give at least one parameter, e.g. "
                         "\"train.learning_rate\" = { log_uniform = [1e-4, 1e-2] }")
    checked = {}
    for key, table in params.items():
        where = f"[sweep.params] {key!r}"
        section, _, name = key.partition(".")
        if not name:
            raise SweepError(f"{where}: parameters look like SECTION.KEY (e.g. train.gamma)")
        kinds = [k for k in DISTRIBUTIONS if isinstance(table, dict) and k in table]
        if len(kinds) != 1:
            raise SweepError(f"{where} must be a table with one distribution of "
                             f"{list(DISTRIBUTIONS)}, e.g. {{ uniform = [0.9, 0.99] }}; got "
                             f"{table!r}")
        kind = kinds[0]
        extra = sorted(k for k in table if k != kind and kind not in DISTRIBUTION_OPTIONS.get(k, ()))
        if extra:
            raise SweepError(f"{where}: unknown option(s) {extra} for a {kind} distribution")
        values = table[kind]
        if kind == "choice":
            if not isinstance(values, list) or not values or not all(
                    isinstance(v, (bool, int, float, str)) for v in values):
                raise SweepError(f"{where}: choice must be a non-empty list of numbers, "
                                 f"strings or booleans, got {values!r}")
        else:
            number = int if kind == "int" else (int, float)
            if not (isinstance(values, list) and len(values) == 2 and all(
                    isinstance(v, number) and not isinstance(v, bool) for v in values)):
                raise SweepError(f"{where}: {kind} takes [low, high] ({'integers' if kind == 'int' else 'numbers'}), "
                                 f"got {values!r}")
            low, high = values
            if not low < high:
                raise SweepError(f"{where}: {kind} bounds must have low < high, got {values!r}")
            if (kind == "log_uniform" or table.get("log")) and low <= 0:
                raise SweepError(f"{where}: a log scale needs low > 0, got {values!r}")
            step = table.get("step")
            if step is not None and (isinstance(step, bool) or not isinstance(step, number)
                                     or step <= 0):
                raise SweepError(f"{where}: step must be a positive number, got {step!r}")
        checked[f"{section}.{name.replace('-', '_')}"] = dict(table)
    return checked


def _enqueue(value) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise SweepError(f"[sweep] enqueue must be a list of tables of parameter values, got "
                         f"{value!r}")
    return [dict(v) for v in value]


def _check_values(sweep: Sweep) -> None:
    """Every bound (and every choice) of every parameter through the config's own
    checks, so a wrong key or value is refused before any training."""
    for item in sweep.enqueue:
        unknown = sorted(set(item) - set(sweep.params))
        if unknown:
            raise SweepError(f"[sweep] enqueue names {unknown}, which [sweep.params] does not "
                             f"vary ({sorted(sweep.params)})")
    for key, table in sweep.params.items():
        kind = next(k for k in DISTRIBUTIONS if k in table)
        for value in table[kind]:
            try:
                sweep.trial_config({key: value}, sweep.seeds[0])
            except ValueError as error:
                raise SweepError(f"[sweep.params] {key!r} = {value!r}: {error}") from None
    for item in sweep.enqueue:
        try:
            sweep.trial_config(item, sweep.seeds[0])
        except ValueError as error:
            raise SweepError(f"[sweep] enqueue {item!r}: {error}") from None


# ---- the study ----------------------------------------------------------------

def open_storage(url: str, heartbeat: bool = False):
    """Optuna's RDB storage at `url`; SweepError (one line) when it cannot be opened."""
    import optuna
    if "://" not in url:
        raise SweepError(f"storage {url!r} is not a database URL (e.g. sqlite:///study.db, "
                         f"postgresql://user@host/db)")
    kwargs = {"heartbeat_interval": HEARTBEAT_INTERVAL, "grace_period": HEARTBEAT_GRACE} \
        if heartbeat else {}
    # Several workers write one SQLite file: wait for its lock rather than fail.
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    try:
        if url.startswith("sqlite:///"):      # the database's folder (the sweep's) may be new
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.RDBStorage(url, engine_kwargs=engine, **kwargs)
    except Exception as error:  # noqa: BLE001 - SQLAlchemy's many kinds, said in one line
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SweepError(f"storage {url!r} cannot be opened: {detail}") from None


def open_study(sweep: Sweep, storage, stream: int = 0):
    """The sweep's study, created or continued; refused when the storage holds a
    study of this name made from another sweep (space, seeds, objective).

    A sampler `seed` is offset by `stream` (a worker's own number), so workers
    and resumed sweeps do not draw the same parameters again."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = dict(sweep.sampler)
    if sampler.get("seed") is not None:
        sampler["seed"] = int(sampler["seed"]) + stream
    study = optuna.create_study(storage=storage, study_name=sweep.name, direction=sweep.direction,
                                sampler=_optuna_object("sampler", sampler),
                                pruner=_optuna_object("pruner", sweep.pruner),
                                load_if_exists=True)
    signature = study.user_attrs.get("peregrine_sweep")
    if signature is None:
        study.set_user_attr("peregrine_sweep", sweep.signature())
    elif signature != sweep.signature():
        raise SweepError(f"study {sweep.name!r} in {sweep.storage} was made from a different "
                         f"sweep (env, config, params, seeds, objective or metric changed): "
                         f"restore the file, or give this sweep another name, --dir or storage")
    if study.direction.name.lower() != sweep.direction:
        raise SweepError(f"study {sweep.name!r} in {sweep.storage} is to "
                         f"{study.direction.name.lower()}, not {sweep.direction}")
    for params in sweep.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)
    return study


def count_trials(study, states=COUNTED) -> int:
    return sum(t.state.name in states for t in study.get_trials(deepcopy=False))


def fail_orphaned_trials(study, storage) -> list[int]:
    """Marks FAIL the RUNNING trials whose process is gone (a killed sweep) and
    returns their numbers: this machine's trials whose process no longer runs, and
    any trial that died before saying whose it is (older than the heartbeat's
    grace period without a pid). Other machines' trials are left to Optuna's
    heartbeat (optuna.storages.fail_stale_trials)."""
    from datetime import datetime

    from optuna.trial import TrialState
    failed = []
    host = socket.gethostname()
    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = trial.user_attrs.get("pid")
        if pid is None:
            started = trial.datetime_start or datetime.now()
            orphaned = (datetime.now() - started).total_seconds() > HEARTBEAT_GRACE
        else:
            orphaned = trial.user_attrs.get("host") == host and not pid_alive(int(pid))
        if not orphaned:
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        if storage.set_trial_state_values(trial_id, TrialState.FAIL):
            failed.append(trial.number)
    return failed


# ---- a trial ----------------------------------------------------------------------

def suggest(trial, params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The trial's value of each parameter, from its distribution."""
    values = {}
    for key, table in params.items():
        if "choice" in table:
            values[key] = trial.suggest_categorical(key, table["choice"])
        elif "int" in table:
            low, high = table["int"]
            values[key] = trial.suggest_int(key, low, high, step=table.get("step", 1),
                                            log=bool(table.get("log", False)))
        else:
            low, high = (table.get("uniform") or table["log_uniform"])
            values[key] = trial.suggest_float(key, float(low), float(high),
                                              step=table.get("step"), log="log_uniform" in table)
    return values


def objective_value(values: list[float], objective: str, direction: str) -> float:
    """The trial's value: the statistic of its seeds' metric values ("worst" is the
    minimum when maximising, the maximum when minimising)."""
    if objective == "median":
        return float(statistics.median(values))
    if objective == "mean":
        return float(statistics.fmean(values))
    return float(min(values) if direction == "maximize" else max(values))


def intermediate_value(record: dict, metric: str) -> float | None:
    """What a training record says about `metric` so far, for the pruner: the
    recent mean return for episode_return, else this update's mean of the stat."""
    if metric == "episode_return":
        return record.get("recent_return")
    if metric == "episode_length":
        return record.get("episode_length")
    return record.get("env_stats", {}).get(metric)


def check_metric(sweep: Sweep) -> None:
    """SweepError before any trial trains when the env's evaluation has no statistic
    `metric`: one episode of a random policy, in the sweep's world, names them."""
    from .envs.native.protocols import DEFAULT_STATS     # every env's evaluation has these
    if sweep.metric in DEFAULT_STATS:
        return
    from .evaluate import evaluate
    config = sweep.trial_config({}, sweep.seeds[0])
    names = evaluate(config.env_name, "random", episodes=1, seed=sweep.eval_seed,
                     **config.env_kwargs)["mean"]
    if sweep.metric not in names:
        raise SweepError(metric_refusal(sweep.metric, config.env_name, names))


def metric_refusal(metric: str, env: str, names) -> str:
    return f"metric {metric!r} is not an evaluation statistic of {env}; its statistics: " \
           f"{sorted(names)}"


def claim_directory(sweep: Sweep) -> None:
    """SweepError when the sweep's directory holds another sweep's trials (their run
    folders and trials.csv would be this one's), named in SWEEP_DIR/sweep-name."""
    directory = Path(sweep.directory)
    marker = directory / "sweep-name"
    owner = marker.read_text().strip() if marker.is_file() else None
    if owner is None and (directory / "trials").is_dir():
        # a directory from before the marker: the studies its default storage holds
        import optuna
        db = directory / "study.db"
        names = {summary.study_name for summary in optuna.study.get_all_study_summaries(
            f"sqlite:///{db.resolve()}")} if db.is_file() else set()
        others = sorted(names - {sweep.name})
        owner = others[0] if others else None
    if owner is not None and owner != sweep.name:
        raise SweepError(f"{str(directory)!r} holds the trials of sweep {owner!r}, not "
                         f"{sweep.name!r}: give this sweep its own --dir")
    directory.mkdir(parents=True, exist_ok=True)
    marker.write_text(sweep.name + "\n")


def trial_dir(sweep: Sweep, number: int) -> Path:
    return Path(sweep.directory) / "trials" / f"{number:04d}"


def run_trial(sweep: Sweep, trial, release=lambda: None) -> float:
    """Optuna's objective: trains and evaluates every seed, reporting progress to
    the pruner; raises optuna.TrialPruned when pruned, KeyboardInterrupt when the
    training was stopped by Ctrl-C or SIGTERM. `release()` is called once the
    trial exists (the worker's ask lock, see `worker`). A trial stopped by Ctrl-C
    anywhere in it is marked "interrupted": it fails (a rerun runs it again) but is
    not counted among the failed ones."""
    release()
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    try:
        return _train_and_evaluate(sweep, trial)
    except KeyboardInterrupt:    # Ctrl-C in training, or before or after it
        trial.set_user_attr("interrupted", True)     # FAIL, but not a failed trial
        raise


def _train_and_evaluate(sweep: Sweep, trial) -> float:
    """run_trial's work: every seed trained and evaluated (see run_trial)."""
    import optuna

    from .evaluate import evaluate
    from .train.run import StopFlag, train
    params = suggest(trial, sweep.params)
    values: list[float] = []
    for index, seed in enumerate(sweep.seeds):
        config = sweep.trial_config(params, seed)
        offset = index * config.train.total_steps
        stop, pruned = StopFlag(), []

        def progress(record, offset=offset, stop=stop, pruned=pruned):
            value = intermediate_value(record, sweep.metric)
            if value is None:
                return
            trial.report(float(value), offset + int(record["global_step"]))
            if trial.should_prune():
                pruned.append(record["global_step"])
                stop.requested = True     # the run ends after this update, saved

        run_dir = trial_dir(sweep, trial.number) / f"seed-{seed}"
        summary = train(config, run_dir, progress=progress, stop=stop)
        if pruned:
            trial.set_user_attr("pruned_at", {"seed": seed, "global_step": pruned[0]})
            raise optuna.TrialPruned(f"seed {seed} at step {pruned[0]}")
        if summary["status"] == "interrupted":
            raise KeyboardInterrupt
        result = evaluate(config.env_name, summary["checkpoint"], episodes=sweep.eval_episodes,
                          seed=sweep.eval_seed)
        if sweep.metric not in result["mean"]:
            raise MetricError(metric_refusal(sweep.metric, config.env_name, result["mean"]))
        values.append(result["mean"][sweep.metric])
        trial.set_user_attr("seed_values", values)
    return objective_value(values, sweep.objective, sweep.direction)


class AskLock:
    """An exclusive lock on SWEEP_DIR/ask.lock, held from counting the trials to
    the new trial being RUNNING, so workers on this machine never start more
    trials than the sweep needs."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(directory / "ask.lock", os.O_RDWR | os.O_CREAT, 0o644)
        self.held = False

    def acquire(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.held = True

    def release(self) -> None:
        if self.held:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.held = False


def worker(sweep: Sweep, index: int = 0) -> None:
    """Runs trials until COMPLETE + PRUNED + RUNNING reaches `trials` (stopping
    also after as many failed trials of its own as the sweep has trials).
    `index`: the worker's number in its sweep command."""
    import optuna
    storage = open_storage(sweep.storage, heartbeat=True)
    study = open_study(sweep, storage)
    # A seeded sampler's own stream: the trials so far and the worker's number.
    study = open_study(sweep, storage, stream=1000 * len(study.get_trials(deepcopy=False)) + index)
    lock = AskLock(Path(sweep.directory))
    failures = 0
    while failures < sweep.trials:
        lock.acquire()
        try:
            # Trials of dead processes (here, or stale elsewhere) no longer hold a place.
            fail_orphaned_trials(study, storage)
            optuna.storages.fail_stale_trials(study)
            counted = count_trials(study)
            if counted >= sweep.trials:
                return
            if counted + count_trials(study, ("RUNNING",)) >= sweep.trials:
                wait = True     # the rest is running elsewhere: take over if one fails
            else:
                wait = False
                before = len(study.get_trials(deepcopy=False))
                study.optimize(lambda trial: run_trial(sweep, trial, lock.release), n_trials=1,
                               catch=(ValueError, FloatingPointError, RuntimeError, OSError))
        finally:
            lock.release()
        if wait:
            time.sleep(2.0)
            continue
        mine = [t for t in study.get_trials(deepcopy=False)[before:]
                if t.user_attrs.get("pid") == os.getpid()]
        failures += sum(t.state == optuna.trial.TrialState.FAIL for t in mine)


class NotAnInterrupt:
    """A logging filter for Optuna's handler: drops its two "Trial N failed" reports of a
    trial that Ctrl-C (or SIGTERM) stopped (the first carries the KeyboardInterrupt's
    traceback, the second, "failed with value None.", names the same trial); the sweep
    command says "interrupted" once instead, and a rerun continues."""

    def __init__(self) -> None:
        self.stopped: set[str] = set()

    def filter(self, record) -> bool:
        trial = re.match(r"Trial (\d+) failed", str(record.msg))
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            if trial:
                self.stopped.add(trial.group(1))
            return False
        return not (trial and trial.group(1) in self.stopped)


def _worker_main(sweep: Sweep, parent: int, index: int) -> None:
    """A worker process: dies with the sweep command, says errors in one line."""
    from .vector.lifetime import die_with_parent
    die_with_parent(parent)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import logging

    import optuna
    from optuna.exceptions import ExperimentalWarning
    warnings.filterwarnings("ignore", category=ExperimentalWarning)   # heartbeat helpers
    optuna.logging.get_logger("optuna")          # its handler, made on first use
    for handler in logging.getLogger("optuna").handlers:
        handler.addFilter(NotAnInterrupt())
    try:
        worker(sweep, index)
    except KeyboardInterrupt:
        sys.exit(130)
    except (SweepError, MetricError) as error:
        print(f"peregrine sweep: error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


# ---- results ------------------------------------------------------------------------

def best_trial(study):
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        return None
    pick = max if study.direction.name == "MAXIMIZE" else min
    return pick(complete, key=lambda t: t.value)


def export_best(sweep: Sweep, study) -> Path | None:
    """SWEEP_DIR/best.toml: the best trial as a config variant (base config file,
    fixed values and the trial's parameters, layered over the env's shipped
    config), checked by load_config; None while no trial is complete."""
    best = best_trial(study)
    if best is None:
        return None
    layers: dict[str, dict[str, Any]] = {"env": {"name": sweep.env}}
    base = read_toml(sweep.config) if sweep.config else {}
    params: dict[str, dict[str, Any]] = {}
    for key, value in best.params.items():
        section, _, name = key.partition(".")
        params.setdefault(section, {})[name] = value
    for layer in (base, sweep.fixed, params):
        for section, values in layer.items():
            layers.setdefault(section, {}).update(values)
    seeds = ", ".join(f"{v:.6g}" for v in best.user_attrs.get("seed_values", []))
    header = [f"# Best trial of sweep {sweep.name!r} ({sweep.path}): trial {best.number},",
              f"# {sweep.objective} {sweep.metric} over seeds {sweep.seeds} = {best.value:.6g} "
              f"(per seed: {seeds}).",
              f"# Train with: peregrine train {sweep.env} --config <this file>"]
    path = Path(sweep.directory) / "best.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_atomically(path) as temporary:
        temporary.write_text("\n".join(header) + "\n" + dump_toml(layers))
        load_config(sweep.env, temporary)  # the variant it claims to be, or an error here
    return path


def export_trials(sweep: Sweep, study) -> Path:
    """SWEEP_DIR/trials.csv: every trial of the study, one row each: number,
    state, objective (complete trials), the per-seed values, where a pruned
    trial stopped (seed, that run's global step, the value it reported last)
    and its parameters (one column per swept key)."""
    import csv
    trials = study.get_trials(deepcopy=False)
    keys = list(sweep.params)
    path = Path(sweep.directory) / "trials.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_atomically(path) as temporary, open(temporary, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["trial", "state", sweep.objective, "seed_values", "pruned_seed",
                         "pruned_step", "pruned_value", *keys])
        for trial in trials:
            state = trial.state.name
            pruned = trial.user_attrs.get("pruned_at", {}) if state == "PRUNED" else {}
            last = trial.intermediate_values.get(trial.last_step) if pruned else None
            values = trial.user_attrs.get("seed_values", [])
            writer.writerow([trial.number, state,
                             repr(trial.value) if state == "COMPLETE" else "",
                             " ".join(repr(v) for v in values), pruned.get("seed", ""),
                             pruned.get("global_step", ""), "" if last is None else repr(last),
                             *(trial.params.get(key, "") for key in keys)])
    return path


def save_plots(sweep: Sweep, study) -> list[Path]:
    """history.png (objective by trial) and, with >= 2 parameters and >= 2
    complete trials, importances.png (Optuna's fANOVA importances)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots
    saved = []
    complete = count_trials(study, ("COMPLETE",))
    wanted = [("history.png", plots.plot_optimization_history)]
    if len(sweep.params) >= 2 and complete >= 2:
        wanted.append(("importances.png", plots.plot_param_importances))
    for name, plot in wanted:
        if complete == 0:
            break
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # Optuna marks these experimental
            try:
                axes = plot(study)
            except (ValueError, RuntimeError, ZeroDivisionError) as error:
                print(f"peregrine sweep: no {name}: {error}", file=sys.stderr)
                continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.set_size_inches(8, 5)
        figure.tight_layout()
        path = Path(sweep.directory) / name
        figure.savefig(path, dpi=100)
        plt.close(figure)
        saved.append(path)
    return saved


def describe(trial) -> dict[str, str]:
    """A trial's row: number, state, value, params (short), per-seed values."""
    value = "" if trial.value is None else f"{trial.value:.6g}"
    seeds = ", ".join(f"{v:.4g}" for v in trial.user_attrs.get("seed_values", []))
    params = " ".join(f"{k.split('.', 1)[1]}={_short(v)}" for k, v in trial.params.items())
    return {"trial": str(trial.number), "state": trial.state.name, "value": value,
            "seeds": seeds, "params": params}


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ---- the command ------------------------------------------------------------------

def run_sweep(sweep: Sweep, jobs: int = 1, live: bool | None = None, out=None) -> int:
    """`peregrine sweep`: opens (or continues) the study, runs `jobs` worker
    processes until the sweep has its trials, shows the trials as they finish (a
    live Rich table on a terminal, plain lines otherwise), exports best.toml and
    trials.csv and saves the plots. Returns the exit status (0 done, 130 Ctrl-C,
    else a worker's)."""
    import multiprocessing

    from .vector.common import available_cores, warn_if_oversubscribed
    out = out or sys.stdout
    live = out.isatty() if live is None else live
    if jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {jobs}")
    claim_directory(sweep)
    check_metric(sweep)
    storage = open_storage(sweep.storage)
    study = open_study(sweep, storage)
    failed = fail_orphaned_trials(study, storage)
    if failed:
        print(f"trial(s) {failed} were running when the sweep was stopped: marked FAIL, "
              f"not counted", file=out, flush=True)
    done = count_trials(study)
    print(f"sweep {sweep.name!r}: {sweep.env}, {done}/{sweep.trials} trials done, "
          f"{sweep.objective} {sweep.metric} over seeds {sweep.seeds}, {jobs} job(s) on "
          f"{available_cores()} core(s); storage {sweep.storage}", file=out, flush=True)
    warn_if_oversubscribed(jobs, "sweep jobs", "Pass --jobs N with N at most that count.")
    workers = []
    if done < sweep.trials:
        # spawn, not fork: a worker starts clean (torch, threads) whatever this process holds
        context = multiprocessing.get_context("spawn")
        workers = [context.Process(target=_worker_main, args=(sweep, os.getpid(), i),
                                   name=f"sweep-worker-{i}") for i in range(jobs)]
        for process in workers:
            process.start()
    code = 0
    try:
        code = _watch(sweep, study, workers, live, out)
    except KeyboardInterrupt:
        code = 130   # the workers got the same Ctrl-C: their runs stop after this update
        _stop_workers(workers, grace=30.0)
    finally:
        _stop_workers(workers, grace=0.0)
    best = export_best(sweep, study)
    table = export_trials(sweep, study)
    plots = save_plots(sweep, study)
    counted = count_trials(study)
    stopped = sum(t.state.name == "FAIL" and bool(t.user_attrs.get("interrupted"))
                  for t in study.get_trials(deepcopy=False))
    print(f"{counted}/{sweep.trials} trials done ({count_trials(study, ('PRUNED',))} pruned, "
          f"{count_trials(study, ('FAIL',)) - stopped} failed"
          f"{f', {stopped} interrupted' if stopped else ''})", file=out, flush=True)
    winner = best_trial(study)
    if winner is not None:
        print(f"best: trial {winner.number}, {sweep.objective} {sweep.metric} "
              f"{winner.value:.6g}: {describe(winner)['params']}", file=out)
        print(f"best config: {best}  (peregrine train {sweep.env} --config {best})", file=out)
    print(f"trials: {table}", file=out)
    if plots:
        print(f"plots: {', '.join(str(p) for p in plots)}", file=out, flush=True)
    if code == 130 and counted < sweep.trials:
        print(f"peregrine sweep: interrupted with {counted} of {sweep.trials} trials: the same "
              f"command continues the sweep", file=sys.stderr)
    if code == 0 and counted < sweep.trials:
        print(f"peregrine sweep: stopped with {counted} of {sweep.trials} trials: the workers "
              f"gave up after repeated failed trials (see the errors above)", file=sys.stderr)
        code = 1
    return code


def _stop_workers(workers, grace: float) -> None:
    deadline = time.monotonic() + grace
    for process in workers:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in workers:
        if process.is_alive():
            process.terminate()      # SIGTERM: a training run stops after its update
            process.join(timeout=10.0)
        if process.is_alive():
            process.kill()
            process.join()


def _watch(sweep: Sweep, study, workers, live: bool, out) -> int:
    """Shows trials until every worker has exited; exports best.toml at each newly
    completed trial. A worker failing stops the others; its status is returned."""
    shown: dict[int, str] = {t.number: t.state.name for t in study.get_trials(deepcopy=False)}
    display = _LiveTable(sweep, out) if live else None
    try:
        while True:
            trials = study.get_trials(deepcopy=False)
            newly_complete = False
            for trial in trials:
                state = trial.state.name
                if shown.get(trial.number) == state:
                    continue
                shown[trial.number] = state
                newly_complete |= state == "COMPLETE"
                if display is None and state != "RUNNING":
                    _print_line(trial, study, out)
            if newly_complete:
                export_best(sweep, study)
            if display is not None:
                display.update(trials, best_trial(study))
            codes = [p.exitcode for p in workers if not p.is_alive()]
            bad = [c for c in codes if c not in (0, None)]
            if bad:
                _stop_workers(workers, grace=0.0)
                return bad[0] if bad[0] > 0 else 1
            if len(codes) == len(workers):
                return 0
            time.sleep(0.5)
    finally:
        if display is not None:
            display.close()


def _print_line(trial, study, out) -> None:
    row = describe(trial)
    value = f" value {row['value']}" if row["value"] else ""
    seeds = f" (seeds {row['seeds']})" if row["seeds"] else ""
    best = best_trial(study)
    best_text = f" | best: trial {best.number} ({best.value:.6g})" if best is not None else ""
    print(f"trial {row['trial']} {row['state']}{value}{seeds}: {row['params']}{best_text}",
          file=out, flush=True)


class _LiveTable:
    """The trials as a Rich table redrawn in place (the dashboard's look: a titled
    panel, dim headers, the best trial highlighted)."""

    ROWS = 20     # most recent trials shown

    def __init__(self, sweep: Sweep, out):
        from rich.console import Console
        from rich.live import Live
        self.sweep = sweep
        self.live = Live(console=Console(file=out), auto_refresh=False)
        self.live.start()

    def update(self, trials, best) -> None:
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text
        table = Table(expand=True, header_style="dim")
        for column in ("trial", "state", "value", "seeds", "params"):
            table.add_column(column, justify="right" if column in ("trial", "value") else "left",
                             overflow="fold")
        styles = {"COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red", "RUNNING": "cyan"}
        for trial in trials[-self.ROWS:]:
            row = describe(trial)
            style = "bold" if best is not None and trial.number == best.number else None
            # Text, not markup: a parameter's value may hold brackets
            table.add_row(Text(row["trial"]), Text(row["state"], style=styles[row["state"]]
                                                   if row["state"] in styles else ""),
                          Text(row["value"]), Text(row["seeds"]), Text(row["params"]),
                          style=style)
        counted = sum(t.state.name in COUNTED for t in trials)
        best_text = f", best {best.value:.6g} (trial {best.number})" if best is not None else ""
        title = (f"peregrine sweep {self.sweep.name}: {self.sweep.env}, {counted}/"
                 f"{self.sweep.trials} trials, {self.sweep.objective} {self.sweep.metric}"
                 f"{best_text}")
        self.live.update(Panel(table, title=title, title_align="left"), refresh=True)

    def close(self) -> None:
        self.live.stop()
