"""`peregrine sweep SWEEP.toml [--jobs N] [--dir DIR] [--trials N]`.

    peregrine sweep benchmarks/configs/cartpole_sweep.toml            # one trial at a time
    peregrine sweep benchmarks/configs/cartpole_sweep.toml --jobs 2   # two worker processes

Tunes a config with Optuna (peregrine/sweep.py says what a sweep file holds).
Running the same command again continues the study where it stopped. The sweep
folder (--dir, default runs/sweeps/<file stem>) gets the study database, every
trial's runs, best.toml (train it with `peregrine train ENV --config best.toml`),
trials.csv (every trial, one row each) and the study's plots.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("file", metavar="SWEEP.toml", help="the sweep file ([sweep] table and "
                        "the config sections fixed for every trial)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="trials in parallel, one worker process each (at most one per "
                             "core; each trial trains single-threaded)")
    parser.add_argument("--dir", metavar="DIR", help="the sweep folder (default "
                        "runs/sweeps/<file stem>): study.db, trials/, best.toml, trials.csv, plots")
    parser.add_argument("--trials", type=int, metavar="N",
                        help="COMPLETE + PRUNED trials to reach (default: the file's)")


def run(args) -> int:
    # The file, its search space and the storage are checked before any training.
    from ..sweep import load_sweep, run_sweep
    sweep = load_sweep(args.file, directory=args.dir, trials=args.trials)
    return run_sweep(sweep, jobs=args.jobs)
