"""The `peregrine` command: one subcommand per module, imported only when used.

Each subcommand is a module of this package, which nothing else imports; it exposes
`add_arguments(parser)` and `run(args) -> int` (and optionally
`parse_arguments(parser, argv) -> args` when it takes open-ended options). Adding a command is one row in
COMMANDS; `peregrine --help` stays fast because nothing heavy is imported.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

# Third-party modules a command may need -> the extra that installs them.
EXTRAS = {"torch": "train", "rich": "train", "matplotlib": "train", "PIL": "train",
          "cuda": "cuda", "pettingzoo": "pettingzoo", "optuna": "sweep", "wandb": "wandb"}

# name -> (module, one-line help)
COMMANDS = {
    "train": ("peregrine.cli.train", "train an agent with PPO (live dashboard)"),
    "eval": ("peregrine.cli.eval", "evaluate a policy or checkpoint: episode statistics"),
    "bench": ("peregrine.cli.bench", "measure env steps/s of a native env"),
    "sweep": ("peregrine.cli.sweep", "tune a config's hyperparameters with Optuna over several seeds"),
    "profile": ("peregrine.cli.profile", "throughput profiler with JSON artifacts and targets"),
    "monitor": ("peregrine.cli.monitor", "attach a dashboard to a run"),
    "envs": ("peregrine.cli.envs", "list environments and their spaces"),
    "render": ("peregrine.cli.render", "render an episode to a GIF"),
    "new-env": ("peregrine.cli.new_env", "write a working C env package to start from"),
}


def headless() -> bool:
    """Linux without an X or Wayland display."""
    return sys.platform.startswith("linux") and not os.environ.get("DISPLAY") \
        and not os.environ.get("WAYLAND_DISPLAY")


def main(argv=None) -> int:
    # NumPy's OpenBLAS otherwise keeps spinning threads that compete with the
    # env threads on small machines; users can still set their own value.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Linux without an X or Wayland display: envs drawn with pygame (Gymnasium's classic
    # control) make their rgb_array frames with SDL's dummy video driver, instead of
    # SDL printing "error: XDG_RUNTIME_DIR is invalid" (which reads like a Peregrine
    # error) on every env it starts. No window could open there anyway.
    if headless():
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(prog="peregrine", description="Reinforcement learning built for throughput.")
    # Printed here rather than by argparse's version action, which would need the
    # string at every start of every command: importing importlib.metadata takes
    # tens of milliseconds, a cost the torch-free commands (envs, bench) need not pay.
    top.add_argument("--version", action="store_true", help="print the version and exit")
    if argv[:1] == ["--version"]:
        print(f"peregrine {version()}")
        return 0
    top.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND",
                     help="; ".join(f"{n}: {h}" for n, (_, h) in COMMANDS.items()))
    if not argv:   # a usage error, as argparse makes a missing command: the help, exit 2
        top.print_help(sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "--version") or argv[0] not in COMMANDS:
        top.parse_args(argv[:1])   # exits: help (0) or an unknown command (2)
    name = argv[0]
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if _missing_extra(name, error):
            return 2
        if error.name and module_name.startswith(error.name):
            print(f"peregrine {name}: not available in this version", file=sys.stderr)
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"peregrine {name}", description=help_text)
    module.add_arguments(parser)
    # A command with open-ended options (train's --SECTION.KEY VALUE) parses
    # its own argument list; the rest use the parser as is.
    custom_parse = getattr(module, "parse_arguments", None)
    args = custom_parse(parser, argv[1:]) if custom_parse else parser.parse_args(argv[1:])
    try:
        with _plain_warnings(name):
            return int(module.run(args) or 0)
    except ModuleNotFoundError as error:   # commands import their heavy modules late
        if _missing_extra(name, error):
            return 2
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ValueError as error:  # bad input: a clear message, not a traceback
        print(f"peregrine {name}: error: {error}", file=sys.stderr)
        return 2
    except (OSError, MemoryError, FloatingPointError) as error:
        # unwritable/full run directory, too big a batch, a diverged training
        print(f"peregrine {name}: error: {error}", file=sys.stderr)
        return 1
    except RuntimeError as error:
        failure = _worker_failure(error)
        if failure is None:
            raise
        print(f"{failure[0]}peregrine {name}: error: {failure[1]}", file=sys.stderr)
        return 1


def _worker_failure(error: RuntimeError) -> tuple[str, str] | None:
    """(what to print before the error line, the error line) for an env that failed
    in a vector env's worker process: the env's own traceback where its code raised
    (its file and line), nothing more where one of Peregrine's checks refused what it
    returned, or the worker's death; None for any other RuntimeError (a bug: its
    traceback). The parent's traceback through the trainer says nothing to a user."""
    processes = sys.modules.get("peregrine.vector.processes")
    if processes is None:       # never imported: no worker ran
        return None
    if isinstance(error, processes.WorkerError):
        before = error.env_traceback.rstrip() + "\n" if error.env_traceback else ""
        return before, error.summary
    if isinstance(error, processes.WorkerDiedError):
        return "", str(error)
    return None


@contextlib.contextmanager
def _plain_warnings(command: str):
    """While a command runs, Peregrine's own warnings as one line each ("peregrine train:
    warning: ..."), not Python's "file.py:254: CoresWarning:" and a source line; other
    libraries' keep Python's format, and so does the library used from Python."""
    import warnings
    python_format = warnings.formatwarning

    def formatted(message, category, filename, lineno, line=None):
        if category.__module__.startswith("peregrine."):
            return f"peregrine {command}: warning: {message}\n"
        return python_format(message, category, filename, lineno, line)
    warnings.formatwarning = formatted
    try:
        yield
    finally:
        warnings.formatwarning = python_format


def _missing_extra(command: str, error: ModuleNotFoundError) -> bool:
    """Names the extra to install when `error` is a missing optional dependency."""
    missing = (error.name or "").split(".")[0]
    if missing not in EXTRAS:
        return False
    print(f"peregrine {command} needs {missing}, which is not installed: "
          f"pip install 'peregrine-rl[{EXTRAS[missing]}]'", file=sys.stderr)
    return True


def version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib import metadata
    try:
        return metadata.version("peregrine-rl")
    except metadata.PackageNotFoundError:
        from .. import __version__
        return __version__


if __name__ == "__main__":
    sys.exit(main())
