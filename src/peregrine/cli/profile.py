"""`peregrine profile ENV --mode env_only|trainer|trainer_eval --seconds S ...`

Measures steady-state steps/s after a warm-up (see `runner`), prints a
summary, and writes a JSON artifact (schema: docs/profiler.md) to
``artifacts/throughput/<UTC timestamp>_<env>_<mode>.json`` and, with
``--json PATH``, to PATH as well.

Exit codes:
    0  measured (and, with --enforce-target, the target was met)
    2  bad arguments (unknown env or mode, non-positive seconds, ...)
    3  --enforce-target and the measured steps/s is below --target-steps-per-sec
    4  the mode needs the trainer (peregrine.train / torch) and it is not available
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..files import written_atomically
from ..profile.runner import MODES, TrainerUnavailable

SCHEMA = "peregrine.profile/1"
EXIT_OK = 0
EXIT_TARGET_MISSED = 3
EXIT_TRAINER_UNAVAILABLE = 4
DEFAULT_ARTIFACTS_DIR = Path("artifacts") / "throughput"


def add_arguments(parser) -> None:
    parser.add_argument("env", help="a native env (see `peregrine envs`), gym:ID, "
                                    "pettingzoo:MODULE or module:function")
    parser.add_argument("--mode", default="env_only", choices=MODES,
                        help="env_only: the C batch with random actions; trainer: PPO updates; "
                             "trainer_eval: PPO updates plus periodic evaluation (default env_only)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="seconds run first and discarded (default 1; trainer modes: at least one update)")
    parser.add_argument("--num-envs", type=int, default=None,
                        help="env instances (env_only default 4096; trainer modes default: the env's config)")
    parser.add_argument("--threads", type=int, default=None, help="C step threads (default 1 / the config)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="trainer config override, e.g. --set train.horizon=64 (repeatable)")
    parser.add_argument("--eval-interval", type=int, default=5,
                        help="trainer_eval: evaluate every N updates (default 5)")
    parser.add_argument("--eval-episodes", type=int, default=16,
                        help="trainer_eval: episodes per evaluation (default 16)")
    parser.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                        help="also write the artifact to PATH ('-' for stdout)")
    parser.add_argument("--artifacts-dir", default=str(DEFAULT_ARTIFACTS_DIR),
                        help=f"where artifacts go (default {DEFAULT_ARTIFACTS_DIR})")
    parser.add_argument("--no-artifact", action="store_true", help="do not write to --artifacts-dir")
    parser.add_argument("--target-steps-per-sec", type=float, default=None, metavar="N",
                        help="record whether steady-state steps/s reaches N")
    parser.add_argument("--enforce-target", action="store_true",
                        help=f"exit {EXIT_TARGET_MISSED} if steps/s is below --target-steps-per-sec")


def check_arguments(args) -> None:
    from ..vector.sources import kind_of
    kind_of(args.env)       # an unknown name: the kinds of names listed
    if not args.seconds > 0:
        raise ValueError(f"--seconds must be positive, got {args.seconds}")
    if not args.warmup >= 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    for name in ("num_envs", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive int, got {value}")
    if args.eval_interval < 1 or args.eval_episodes < 1:
        raise ValueError("--eval-interval and --eval-episodes must be positive")
    if args.target_steps_per_sec is not None and not args.target_steps_per_sec > 0:
        raise ValueError(f"--target-steps-per-sec must be positive, got {args.target_steps_per_sec}")
    if args.enforce_target and args.target_steps_per_sec is None:
        raise ValueError("--enforce-target needs --target-steps-per-sec N")
    if args.overrides and args.mode == "env_only":
        raise ValueError("--set overrides configure the trainer; they do not apply to --mode env_only")


def parse_overrides(args) -> list[tuple[str, str]]:
    overrides = []
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ValueError(f"--set expects SECTION.KEY=VALUE, got {item!r}")
        overrides.append((key.strip().replace("-", "_"), value.strip()))
    if args.num_envs is not None:
        overrides.append(("vec.num_envs", args.num_envs))
    if args.threads is not None:
        overrides.append(("vec.num_threads", args.threads))
    return overrides


def measure(args) -> dict:
    from ..profile import runner

    if args.mode == "env_only":
        from ..vector.sources import is_native_name
        default_envs = 4096 if is_native_name(args.env) else 16    # Python envs: 16
        return runner.profile_env_only(args.env, args.seconds, args.warmup,
                                       num_envs=args.num_envs or default_envs,
                                       num_threads=args.threads or 1, seed=args.seed)
    return runner.profile_trainer(args.env, args.seconds, args.warmup, overrides=parse_overrides(args),
                                  evaluate_every=args.eval_interval if args.mode == "trainer_eval" else 0,
                                  eval_episodes=args.eval_episodes, seed=args.seed)


def build_artifact(args, measured: dict, started) -> dict:
    from ..profile.machine import commit_info, machine_facts

    sps = measured["steady_state"]["steps_per_sec"]
    target = args.target_steps_per_sec
    met = None if target is None else sps >= target
    return {
        "schema": SCHEMA,
        "env": args.env,
        "mode": args.mode,
        "date": started.isoformat(timespec="seconds"),
        "commit": commit_info(),
        "machine": machine_facts(),
        "command": ["peregrine", "profile", *sys.argv[2:]] if sys.argv[1:2] == ["profile"] else sys.argv,
        "requested": {"seconds": args.seconds, "warmup": args.warmup},
        "setup": measured["setup"],
        "steady_state": measured["steady_state"],
        "warmup": measured["warmup"],
        "time_split_seconds": measured["time_split_seconds"],
        "time_split_fraction": measured["time_split_fraction"],
        "resources": measured["resources"],
        "target": {"steps_per_sec": target, "met": met, "enforced": bool(args.enforce_target),
                   "ratio": None if target is None else sps / target},
        "exit_code": EXIT_TARGET_MISSED if (args.enforce_target and not met) else EXIT_OK,
    }


def artifact_path(directory: Path, started, env: str, mode: str) -> Path:
    stem = f"{started.strftime('%Y%m%dT%H%M%SZ')}_{env}_{mode}"
    path = directory / f"{stem}.json"
    suffix = 1
    while path.exists():
        path = directory / f"{stem}-{suffix}.json"
        suffix += 1
    return path


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_atomically(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2) + "\n")


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def memory_text(resources: dict) -> str:
    """Peak RSS of the profiling process (and of the processes it started), CPU, GPU."""
    peak, total = resources.get("peak_rss_mb"), resources.get("peak_rss_total_mb")
    text = "unknown on this platform" if peak is None else f"{peak:,.0f} MiB RSS"
    others = len(resources.get("processes", {}))
    if others and total is not None:
        text += f" ({total:,.0f} MiB with {others} child process{'es' if others > 1 else ''})"
    if resources.get("cpu_percent") is not None:
        text += f"; CPU {resources['cpu_percent']:.0f}%"
    if resources.get("gpu_util_percent") is not None:
        text += (f"; GPU {resources['gpu_util_percent']:.0f}%, "
                 f"{resources.get('gpu_memory_mb', 0):,.0f} MiB in use")
    return text


def report(artifact: dict, written: list[str]) -> str:
    setup, steady = artifact["setup"], artifact["steady_state"]
    spread = steady["unit_steps_per_sec"]
    lines = [
        f"profile {artifact['env']} --mode {artifact['mode']}: {setup.get('num_envs')} envs, "
        f"{setup.get('rows')} rows, {setup.get('num_threads')} thread(s); warm-up "
        f"{artifact['warmup']['seconds']:.1f} s, measured {steady['seconds']:.1f} s over {steady['units']} units",
        f"  steps/s (steady) : {_rate(steady['steps_per_sec'])}",
        f"  per unit         : min {_rate(spread['min'])}, median {_rate(spread['median'])}, "
        f"max {_rate(spread['max'])}, cv {spread['cv']:.1%}",
        "  time split       : " + ", ".join(f"{name} {share:.1%}" for name, share
                                            in artifact["time_split_fraction"].items()),
    ]
    if "env_steps_per_sec" in steady and setup.get("agents_per_env", 1) != 1:
        lines.insert(2, f"  env steps/s      : {_rate(steady['env_steps_per_sec'])}")
    lines.append("  peak memory      : " + memory_text(artifact["resources"]))
    target = artifact["target"]
    if target["steps_per_sec"] is not None:
        verdict = "met" if target["met"] else "NOT met"
        lines.append(f"  target           : {_rate(target['steps_per_sec'])} steps/s -> {verdict} "
                     f"({target['ratio']:.2f}x){' [enforced]' if target['enforced'] else ''}")
    commit = artifact["commit"]
    if commit["hash"]:
        lines.append(f"  commit           : {commit['hash'][:12]}{' (dirty)' if commit['dirty'] else ''}")
    machine = artifact["machine"]
    lines.append(f"  machine          : {machine['cpu_model']}, {machine['usable_cores']} usable cores, "
                 f"load {machine['load_average_1_5_15']}")
    for path in written:
        lines.append(f"  artifact         : {path}")
    return "\n".join(lines)


def run(args) -> int:
    check_arguments(args)
    if args.mode != "env_only":
        parse_overrides(args)  # refuse a malformed --set before any work
    from ..profile.machine import utc_now

    started = utc_now()
    try:
        measured = measure(args)
    except TrainerUnavailable as error:
        print(f"peregrine profile: {error}", file=sys.stderr)
        return EXIT_TRAINER_UNAVAILABLE
    artifact = build_artifact(args, measured, started)
    written = []
    if not args.no_artifact:
        path = artifact_path(Path(args.artifacts_dir), started, args.env, args.mode)
        write_json(path, artifact)
        written.append(str(path))
    if args.json_path == "-":
        print(json.dumps(artifact, indent=2))
    else:
        if args.json_path:
            write_json(Path(args.json_path), artifact)
            written.append(args.json_path)
        print(report(artifact, written))
    if artifact["exit_code"] == EXIT_TARGET_MISSED:
        print(f"peregrine profile: {_rate(artifact['steady_state']['steps_per_sec'])} steps/s is below the "
              f"target {_rate(args.target_steps_per_sec)} (exit {EXIT_TARGET_MISSED})", file=sys.stderr)
    return artifact["exit_code"]
