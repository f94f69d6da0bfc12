"""`peregrine train ENV [--config FILE] [--SECTION.KEY VALUE ...]`.

    peregrine train cartpole                         # shipped config, dashboard on a TTY
    peregrine train cartpole --train.learning-rate 3e-4 --vec.num-envs 64
    peregrine train cartpole --detach                # headless: metrics.jsonl only
    peregrine train --resume runs/cartpole-...       # continue where it stopped
    peregrine train cartpole --nproc 2               # 2 data-parallel ranks (torchrun)
    peregrine train cartpole --nproc auto            # one rank per core, same global batch

Display: `--monitor` starts `peregrine monitor RUN_DIR` as a child process
(a Rich dashboard reading the run's metrics; closing it never affects
training); `--detach` prints nothing but the run directory and the final
summary. Without either, a TTY gets the dashboard and anything else gets one
plain progress line every `train.progress_interval` updates. When the monitor
module is not installed, `--monitor` falls back to the plain lines.

Several ranks: `--nproc N` runs this same command as N ranks through
`torch.distributed.run`; a worker that torchrun started (WORLD_SIZE > 1) trains
as its rank (see distributed.py), and only rank 0 prints or shows a dashboard.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ..train.config import (SECTIONS, check_features, load_config, parse_override_tokens,
                            shipped_configs, shipped_variants, split_overrides)

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (f"Overrides: --SECTION.KEY VALUE with SECTION one of "
                     f"{['env', *SECTIONS]} (e.g. --train.learning-rate 3e-4, "
                     f"--vec.num-envs 64). Shipped configs: {', '.join(shipped_configs())}; "
                     f"variants (--config NAME): {_variants()}.")
    parser.usage = ("peregrine train [ENV] [--config FILE] [--resume RUN_DIR] [--seed N] "
                    "[--total-steps N] [--run-dir DIR] [--overwrite] [--nproc N] "
                    "[--max-restarts K] [--monitor | --detach] [--SECTION.KEY VALUE ...]")
    parser.add_argument("env", nargs="?", help="env name (omit with --resume)")
    _add_flags(parser)


def _variants() -> str:
    found = [f"{env} {name}" for env in shipped_configs() for name in shipped_variants(env)]
    return ", ".join(found) or "none"


def parse_arguments(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Overrides are open-ended (--train.learning-rate 3e-4), so they are taken
    out of the argument list (each with its value) before argparse sees the
    rest; run() checks them by name."""
    rest, overrides = split_overrides(list(argv))
    namespace = parser.parse_args(rest)
    namespace.overrides = overrides
    namespace.argv = list(argv)
    return namespace


def _add_flags(parser):
    parser.add_argument("--config", help="TOML file layered over the env's shipped config, "
                        "or the name of a shipped variant (e.g. --config fast)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    # text, read as --train.KEY values are (1e6 a count; a bad value named by its key)
    parser.add_argument("--seed", help="shorthand for --train.seed")
    parser.add_argument("--total-steps", help="shorthand for --train.total-steps")
    parser.add_argument("--run-dir", help="exact run directory (default: runs/<env>-<time>-s<seed>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="a --run-dir that holds something: move it aside (to "
                             "NAME.replaced-TIME) and start a new run there")
    parser.add_argument("--nproc", type=_nproc, default=1, metavar="N",
                        help="data-parallel ranks on this machine, started by "
                             "torch.distributed.run (vec.num_envs is per rank); 'auto': one "
                             "rank per available core, the config's batch split over them")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="with --nproc: restart every rank from the last checkpoint "
                             "after a rank fails, up to K times (torchrun's --max-restarts)")
    display = parser.add_mutually_exclusive_group()
    display.add_argument("--monitor", action="store_true", help="live dashboard (child process)")
    display.add_argument("--detach", action="store_true", help="headless: no dashboard, no progress")


def _nproc(value: str):
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int or 'auto', got {value!r}") from None


def run(args) -> int:
    overrides = parse_override_tokens(getattr(args, "overrides", None) or [])
    if args.seed is not None:
        overrides.append(("train.seed", args.seed))
    if args.total_steps is not None:
        overrides.append(("train.total_steps", args.total_steps))
    # OpenMP threads that spin while waiting made torch_threads = 2 about 80x
    # slower on a 2-core machine (13k vs 1.06M SPS, benchmarks/RESULTS.md);
    # sleeping waits cost nothing measurable at 1 thread. Must precede torch
    # (and any native library that loads OpenMP).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    # Everything a user can get wrong on the command line is checked before torch
    # is imported (about a second, several on a loaded machine), so a mistake costs
    # one line in a fraction of a second: flags first, then the config itself
    # (load_config validates the env name, keys, values and variants).
    _check_flags(args)
    config = None
    if not args.resume:
        if args.env is None and args.config is None:
            raise ValueError("give an env to train, e.g. `peregrine train cartpole` "
                             f"(shipped configs: {', '.join(shipped_configs())})")
        config = load_config(args.env, args.config, overrides)
        if config.defaults == "continuous":
            print(_continuous_note(config), flush=True)

    from ..train import run as runs  # imports torch: only after the arguments are sound
    where = runs.distributed.place()    # this process's rank, read once
    if args.resume:
        run_dir = Path(args.resume)
        rank = where.rank
        if where.launched and rank != 0 and not (run_dir / "config.toml").is_file():
            # Rank 0 alone writes the run directory, but every rank reads it on resume.
            raise ValueError(f"--resume {str(run_dir)!r}: rank {rank} finds no run there; "
                             f"on several nodes every node needs the run directory (a shared "
                             f"filesystem, or a copy of rank 0's)")
        config = runs.load_run_config(run_dir, overrides)
        if args.env is not None and args.env != config.env_name:
            raise ValueError(f"--resume {str(run_dir)!r} is a {config.env_name!r} run, not "
                             f"{args.env!r}")
    else:
        run_dir = Path(args.run_dir) if args.run_dir else None   # None: named when it starts
    if args.nproc != 1 and where.launched:
        raise ValueError("--nproc cannot be used inside torchrun (it starts the ranks itself)")
    # A resumed run's checkpoint (its world size, what a resume may change), read once.
    saved = _saved_checkpoint(args.resume) if args.resume and args.nproc != 1 else None
    saved_ranks = int(saved.get("world_size", 1)) if saved is not None else None
    if args.nproc == "auto":
        args.nproc, args.rank_overrides = _auto_ranks(config, saved_ranks)
    if args.nproc != 1:    # the ranks must share one directory: named here, before them
        return _launch(args, config, run_dir or runs.new_run_dir(config), saved)
    if args.max_restarts:
        raise ValueError("--max-restarts needs --nproc (or torchrun's own --max-restarts)")
    quiet = where.launched and not where.is_main
    if quiet:   # ranks other than 0 print nothing but their errors
        args.detach, args.monitor = True, False

    mode = "detach" if args.detach else "monitor" if args.monitor else (
        "monitor" if sys.stdout.isatty() else "plain")
    child = {}

    def on_start(directory):
        print(f"run directory: {directory}", flush=True)
        if mode == "monitor":
            child["process"] = subprocess.Popen(
                [sys.executable, "-m", "peregrine.cli", "monitor", str(directory)])

    if mode == "plain":
        ranks = where.world_size
        per_rank = f" x {ranks} ranks" if ranks > 1 else ""
        print(f"training {config.env_name}: {config.train.total_steps:,} steps, "
              f"{config.vec.num_envs} envs{per_rank}, seed {config.train.seed}", flush=True)
    summary = None
    try:
        plan = runs.RunPlan(config, run_dir, bool(args.resume), args.overwrite, where)
        summary = runs.train_plan(plan, progress=mode == "plain",
                                  on_start=on_start)
    finally:
        if child.get("process") is not None:
            _finish_monitor(child["process"])
            print(flush=True)  # the dashboard's last frame does not end its line
    recent = summary["recent_return"]
    recent_text = "n/a" if recent is None else f"{recent:.1f}"
    if quiet:
        return runs.exit_code(summary)
    how = f" ({summary['signal']})" if summary.get("signal") else ""
    print(f"{summary['status']}{how}: {summary['global_step']:,} steps in {summary['elapsed']:.2f} s "
          f"of training ({summary['sps']:,.0f} SPS), recent mean return {recent_text}, "
          f"{summary['episodes']:,} episodes", flush=True)
    print(f"checkpoint: {summary['checkpoint']}", flush=True)
    print(f"evaluate:   {_path_prefix(config)}peregrine eval {config.env_name} "
          f"--policy {summary['checkpoint']}", flush=True)
    if summary["status"] == "interrupted":
        print(f"resume:     {_path_prefix(config)}peregrine train --resume "
              f"{summary['run_dir']}", flush=True)
    return runs.exit_code(summary)


def _path_prefix(config) -> str:
    """The PYTHONPATH this run's own modules were found through (a factory's, or a
    `module:Class` wrapper's), so that the printed eval and resume commands import them
    too (`PYTHONPATH=. peregrine train my_envs:corridor`)."""
    from ..vector.sources import kind_of
    python_path = os.environ.get("PYTHONPATH")
    try:
        factory = kind_of(config.env_name) == "factory"
    except ValueError:
        return ""
    wrappers = config.env.get("wrappers") or []
    own_wrapper = any(":" in (w if isinstance(w, str) else str(w.get("name", "")))
                      for w in wrappers if isinstance(w, (str, dict)))
    return f"PYTHONPATH={shlex.quote(python_path)} " \
        if (factory or own_wrapper) and python_path else ""


def _continuous_note(config) -> str:
    """The line that says a run starts from the continuous-action defaults."""
    from ..train.config import CONTINUOUS_DEFAULTS
    values = ", ".join(f"{section}.{key} {getattr(getattr(config, section), key)}"
                       for section, keys in CONTINUOUS_DEFAULTS.items() for key in keys)
    return (f"{config.env_name} has continuous actions: what no file or override sets comes "
            f"from the continuous-action defaults (docs/training.md); this run has {values}")


def _check_flags(args) -> None:
    """Combinations and values of the plain flags (no config needed)."""
    if args.resume and args.config:
        raise ValueError("--config cannot be combined with --resume (the run's own "
                         "config.toml is used; pass overrides instead)")
    if args.resume and args.overwrite:
        raise ValueError("--overwrite starts a new run; it cannot be combined with --resume")
    if args.nproc != "auto" and args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts must be >= 0, got {args.max_restarts}")


def _saved_checkpoint(run_dir) -> dict:
    """A run's checkpoint (its payload: the world size that wrote it, its config)."""
    from ..train import checkpoint
    from ..train.run_dir import checkpoint_path
    return checkpoint.load(checkpoint_path(run_dir))


def _auto_ranks(config, saved_ranks: int | None) -> tuple[int, list[str]]:
    """--nproc auto: (ranks, override tokens for every rank); see distributed.auto_ranks.
    A resumed run keeps the world size its checkpoint was written by (`saved_ranks`)."""
    from ..train import distributed
    if saved_ranks is not None:
        print(f"--nproc auto: {saved_ranks} rank(s), as the checkpoint was written", flush=True)
        return saved_ranks, []
    ranks, overrides, why = distributed.auto_ranks(config, distributed.available_cores())
    print(f"--nproc auto: {why}", flush=True)
    return ranks, [token for key, value in overrides for token in (f"--{key}", str(value))]


def _launch(args, config, run_dir, saved: dict | None) -> int:
    """--nproc N: this command without --nproc/--max-restarts, as N ranks under
    torch.distributed.run (`saved`: a resumed run's checkpoint). What every rank would
    refuse is refused here, once, before N processes start only to fail with N copies
    of the error amid torchrun's report."""
    from ..train.checkpoint import check_resume
    from ..train.distributed import check_world_size, launch, resolve_backend
    from ..train.ppo import resolve_device
    from ..train.run_dir import check_new
    check_features(config, several_ranks=True)
    check_new(run_dir, bool(args.resume), args.overwrite)
    # the device and the collectives' backend (every rank on this machine)
    resolve_backend(config.train.dist_backend, resolve_device(config.train.device),
                    one_machine=True)
    if saved is not None:
        check_world_size(saved, args.nproc)
        check_resume(saved, config)
    argv, rest, i = args.argv, [], 0
    while i < len(argv):
        if argv[i] in ("--nproc", "--max-restarts"):
            i += 2
            continue
        if not argv[i].startswith(("--nproc=", "--max-restarts=")):
            rest.append(argv[i])
        i += 1
    if not args.resume and not args.run_dir:
        # Named once, here: ranks restarted later must find the same directory.
        rest += ["--run-dir", str(run_dir)]
    return launch(args.nproc, rest + list(getattr(args, "rank_overrides", [])),
                  args.max_restarts)


def _finish_monitor(process, grace: float = 3.0) -> None:
    """Lets the dashboard draw the final state and exit; stops it if it lingers."""
    if process is None:
        return
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    except KeyboardInterrupt:
        process.kill()
        process.wait()
