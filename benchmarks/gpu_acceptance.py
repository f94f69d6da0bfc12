#!/usr/bin/env python3
"""GPU acceptance: one command that proves the device path on a GPU and brings back every figure.

    python3 benchmarks/gpu_acceptance.py OUT --wheels .gpu-wheels       # on the GPU machine
    python3 benchmarks/gpu_acceptance.py OUT --dry-run                  # anywhere: the same
                                                                        # stages, tiny, on the CPU
    python3 benchmarks/gpu_acceptance.py --print-download-command        # fills .gpu-wheels

Made for a machine lent for minutes: Python 3.12 with torch (CUDA build),
cuda-bindings, nvidia-cuda-nvrtc, pytest, rich and numpy, but no gymnasium and no
network. It never edits the tree it is run from:

setup   copies the tree (sources, tests, benchmarks; no .git, builds or wheels) to a
        scratch folder, installs the wheels of --wheels there (pip --no-index
        --no-deps --target: gymnasium and the pure-Python packages it needs), builds
        the C extension in the copy, and checks `import peregrine` finds the copy;
d       system: nvidia-smi, the GPU, driver, torch, CUDA, NVRTC and cuda-bindings
        versions (then, after c: GPU utilisation and memory sampled during c);
a       the suite's GPU tests (tests/test_gpu_parity.py at scale, test_gpu_build.py,
        test_device_envs.py) with PEREGRINE_TEST_DEVICE set, so that a GPU that is
        not seen is a failure, not a skip;
b       env-only throughput, every env on the GPU beside the C batch on every core
        (benchmarks/bench_gpu.py);
c       training SPS in one process: CartPole and DroneSwarm with GPU envs and the
        device loop (fp32, bf16, with and without train.compile), C envs feeding
        the GPU learner (vec.split 2), all-CPU on the same machine, and the
        learning checks (CartPole's fast config solves, DroneSwarm's shipped
        config delivers more at the end of its run than at the start).

Each stage runs as its own process group under its own time budget (BUDGET_S,
summing to 8 minutes) and its result is written the moment it ends; b and c
rewrite their result file after every row. A hung or crashed stage is killed and
recorded; the others still run. OUT receives at most 7 small files (the device
tool brings back 8): acceptance.json and acceptance.md (the summary, rewritten
after every stage), acceptance.log (the stages' output), a_tests.log,
b_env_throughput.json, c_training.json and d_gpu_samples.csv. The Markdown
summary is printed last. Exit status 0 when every stage and learning check passed.

--dry-run (= --device cpu --tiny) runs every stage at tiny sizes on the CPU
(tests/test_gpu_acceptance.py runs it in the suite), so the script, its install
step and its report cannot rot between GPU sessions.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Seconds per stage, 8 minutes in all. First estimated from the CPU dry run; on an H200
# with 16 cores (RESULTS "GPU acceptance") the stages took setup 6.6, d 6.2, a 84.1,
# b 70+ (Prospector's 16-thread C batch at 1M instances ran past 70 s) and c 134.1.
# A stage past its budget is killed and recorded as timed out.
BUDGET_S = {"setup": 40, "d_system": 25, "a_tests": 120, "b_env_throughput": 100,
            "c_training": 195}
ORDER = ("setup", "d_system", "a_tests", "b_env_throughput", "c_training")
# What the GPU machine lacks for the core import (gymnasium) and its pure-Python needs,
# at the versions the suite is tested with. cloudpickle is on that machine's image too;
# it travels anyway (22 kB) so that the set is complete by itself.
WHEELS = {"gymnasium": "1.4.0", "farama-notifications": "0.0.6", "cloudpickle": "3.1.3"}
WHEELS_DIR = ".gpu-wheels"
GPU_TEST_FILES = ("tests/test_gpu_parity.py", "tests/test_gpu_build.py",
                  "tests/test_device_envs.py")
TINY_TEST_FILES = ("tests/test_gpu_parity.py",)
COPY_IGNORE = (".git", ".venv", "build", "*.so", "__pycache__", ".pytest_cache", "*.egg-info",
               "runs", "artifacts", ".benchmarks", WHEELS_DIR, ".whl", ".gl")
OUT_FILES = ("acceptance.json", "acceptance.md", "acceptance.log", "a_tests.log",
             "b_env_throughput.json", "c_training.json", "d_gpu_samples.csv")


def download_command() -> str:
    """The one command that fills the wheel folder on a development machine (pure-Python
    wheels; the platform flags keep pip from resolving for this machine instead)."""
    pins = " ".join(f"{name}=={version}" for name, version in WHEELS.items())
    return ("python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 "
            "--implementation cp --platform manylinux2014_x86_64 "
            f"-d {WHEELS_DIR} {pins}")


# ---- the wheel folder ---------------------------------------------------------------

def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_folder(folder: Path) -> dict[str, Path]:
    """{distribution: wheel} for the folder's wheels; refuses what pip would trip on
    later, naming it: a file that is not a wheel, two versions of one distribution,
    a wheel for another Python or platform."""
    if not folder.is_dir():
        raise ValueError(f"--wheels {folder}: no such folder (fill it with: "
                         f"{download_command()})")
    wheels: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        parts = path.name[:-4].split("-") if path.suffix == ".whl" else []
        if len(parts) not in (5, 6):
            raise ValueError(f"--wheels {folder}: {path.name} is not a wheel file")
        name = normalise(parts[0])
        if name in wheels:
            raise ValueError(f"--wheels {folder}: two wheels of {name} ({wheels[name].name}, "
                             f"{path.name}); keep one version")
        if not wheel_fits_this_python(*parts[-3:]):
            raise ValueError(f"--wheels {folder}: {path.name} is not for this Python "
                             f"({sys.implementation.name} {sys.version_info.major}."
                             f"{sys.version_info.minor} on {sysconfig.get_platform()})")
        wheels[name] = path
    return wheels


def wheel_fits_this_python(python_tags: str, abi_tags: str, platform_tags: str) -> bool:
    try:
        from packaging.tags import sys_tags
    except ImportError:          # no packaging: pip itself will refuse a wrong wheel
        return True
    supported = {(tag.interpreter, tag.abi, tag.platform) for tag in sys_tags()}
    return any((python, abi, platform) in supported for python in python_tags.split(".")
               for abi in abi_tags.split(".") for platform in platform_tags.split("."))


def top_level(wheel: Path) -> set[str]:
    """The importable top-level names a wheel installs (from its file list)."""
    import zipfile
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    found = set()
    for name in names:
        first = name.split("/")[0]
        if ".dist-info" in first or ".data" in first:
            continue
        module = first[:-3] if first.endswith(".py") and "/" not in name else first
        if module.isidentifier():
            found.add(module)
    return found


def missing_distributions(wheels: dict[str, Path], environment: dict) -> list[str]:
    """The WHEELS that neither the folder holds nor this Python can import."""
    missing = []
    for name in WHEELS:
        if name in wheels:
            continue
        module = name.replace("-", "_")
        probe = subprocess.run([sys.executable, "-c", f"import {module}"], env=environment,
                               capture_output=True, timeout=60)
        if probe.returncode != 0:
            missing.append(name)
    return missing


# ---- running a stage ----------------------------------------------------------------

class Stage:
    """One stage's record: status (passed / failed / timed out / error), seconds, result."""

    def __init__(self, name: str):
        self.name, self.budget = name, BUDGET_S[name]
        self.status, self.seconds, self.result, self.notes = "not run", 0.0, {}, []

    def as_dict(self) -> dict:
        return {"status": self.status, "seconds": round(self.seconds, 1),
                "budget_s": self.budget, "notes": self.notes, "result": self.result}


def run_process(command, log_path: Path, timeout: float, environment, cwd) -> tuple[str, int]:
    """Runs `command` in its own process group, output appended to `log_path`;
    returns (status, exit code). Past `timeout` the whole group is killed."""
    with open(log_path, "a") as log:
        log.write(f"\n===== {' '.join(map(str, command))} (timeout {timeout:.0f} s)\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env=environment, cwd=cwd, start_new_session=True)
        try:
            code = process.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            log.write(f"\n===== killed after {timeout:.0f} s\n")
            return "timed out", -9
        finally:
            _kill_group(process.pid)          # whatever the stage left running
    return ("passed" if code == 0 else "failed"), code


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Acceptance:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        for name in OUT_FILES:                    # a rerun into the same folder starts clean
            (self.out / name).unlink(missing_ok=True)
        self.work = Path(args.work or tempfile.mkdtemp(prefix="peregrine-acceptance-"))
        self.tree, self.site = self.work / "tree", self.work / "site"
        self.device = args.device
        self.stages = {name: Stage(name) for name in ORDER}
        self.started = time.time()
        self.log = self.out / "acceptance.log"
        self.environment = dict(os.environ)

    # ---- the stages ----
    def setup(self, stage: Stage) -> None:
        deadline = time.monotonic() + stage.budget
        if self.tree.exists():
            shutil.rmtree(self.tree)
        shutil.copytree(ROOT, self.tree, ignore=shutil.ignore_patterns(*COPY_IGNORE))
        stage.result["tree"] = str(self.tree)
        environment = dict(os.environ)
        environment.pop("PYTHONPATH", None)
        wheels = wheel_folder(Path(self.args.wheels).resolve()) if self.args.wheels else {}
        missing = missing_distributions(wheels, environment)
        if missing:
            raise RuntimeError(f"this Python lacks {', '.join(missing)} and --wheels brings "
                               f"no wheel of it: fill the folder with `{download_command()}`")
        stage.result["wheels"] = sorted(path.name for path in wheels.values())
        if wheels:
            status, code = run_process(
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                 "--no-compile", "--no-cache-dir", "--disable-pip-version-check", "--target",
                 str(self.site), *map(str, wheels.values())],
                self.log, deadline - time.monotonic(), environment, self.work)
            if status != "passed":
                raise RuntimeError(f"pip install of the wheels {status} (exit {code}); see "
                                   "acceptance.log")
        include = Path(sysconfig.get_paths()["include"]) / "Python.h"
        if not include.exists():
            raise RuntimeError(f"no {include}: this Python has no development headers, so the "
                               "C extension cannot be built")
        started = time.monotonic()
        status, code = run_process(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "-j",
             str(min(os.cpu_count() or 1, 8))],
            self.log, deadline - time.monotonic(), environment, self.tree)
        stage.result["build_seconds"] = round(time.monotonic() - started, 1)
        if status != "passed":
            # pyproject.toml's SPDX `license` string needs setuptools >= 77: an older
            # one refuses the metadata before building anything, so name the version.
            import importlib.metadata
            tail = self.log.read_text(errors="replace").splitlines()[-8:]
            raise RuntimeError(f"building the C extension {status} (exit {code}; setuptools "
                               f"{importlib.metadata.version('setuptools')}): "
                               + " / ".join(tail))
        paths = [str(self.site)] if wheels else []
        self.environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [*paths, str(self.tree / "src")]), PYTHONUNBUFFERED="1",
            PEREGRINE_CACHE=str(self.work / "cache"), PYTHONDONTWRITEBYTECODE="1")
        modules = sorted({module for path in wheels.values() for module in top_level(path)})
        probe = subprocess.run(
            [sys.executable, "-c", f"import {', '.join(['json', *modules])}; import gymnasium, "
             "peregrine, peregrine.envs.cartpole._cartpole as c; print(json.dumps("
             "[peregrine.__file__, gymnasium.__version__, c.__file__]))"],
            env=self.environment, capture_output=True, text=True,
            timeout=max(deadline - time.monotonic(), 5), cwd=self.work)
        if probe.returncode != 0:
            raise RuntimeError(f"import peregrine from the copy failed:\n{probe.stderr}")
        package, gymnasium_version, extension = json.loads(probe.stdout.strip().splitlines()[-1])
        if not package.startswith(str(self.tree)) or not extension.startswith(str(self.tree)):
            raise RuntimeError(f"import peregrine found {package}, not the copy in {self.tree}")
        stage.result.update(python=sys.version.split()[0], gymnasium=gymnasium_version,
                            extension=Path(extension).name)
        stage.status = "passed"

    def child(self, stage: Stage, child: str, result_path: Path, extra=()) -> None:
        """Runs this script's `--child` part in the copy; it writes `result_path`."""
        command = [sys.executable, str(self.tree / "benchmarks" / "gpu_acceptance.py"),
                   "--child", child, "--result", str(result_path), "--device", self.device,
                   *(["--tiny"] if self.args.tiny else []), *extra]
        stage.status, _ = run_process(command, self.log, stage.budget, self.environment,
                                      self.tree)
        stage.result = read_json(result_path)
        if stage.status != "passed":
            stage.notes.append(f"the {child} process {stage.status}: see acceptance.log")

    def d_system(self, stage: Stage) -> None:
        self.child(stage, "system", self.work / "d_system.json")    # kept in acceptance.json

    def a_tests(self, stage: Stage) -> None:
        files = TINY_TEST_FILES if self.args.tiny else GPU_TEST_FILES
        log = self.out / "a_tests.log"
        environment = dict(self.environment, PEREGRINE_TEST_DEVICE=self.device)
        command = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                   "--timeout", str(stage.budget), *files]
        stage.status, code = run_process(command, log, stage.budget, environment, self.tree)
        stage.result = summarise_pytest(log.read_text(errors="replace"))
        stage.result["exit_code"] = code
        if stage.status == "passed" and not stage.result.get("passed"):
            stage.status = "failed"               # pytest ran no test: nothing was proved

    def b_env_throughput(self, stage: Stage) -> None:
        result = self.out / "b_env_throughput.json"
        if self.args.tiny:
            plan = [f"{name}=32" for name in ("cartpole", "pendulum", "mountain_car",
                                               "mountain_car_continuous", "prospector")]
            plan += ["drone_swarm=8"]
            sizing = ["--seconds", "0.05", "--threads", "1"]
        else:
            plan = ["cartpole=65536,1048576,4194304,16777216", "pendulum=4194304",
                    "mountain_car=4194304", "mountain_car_continuous=4194304",
                    "drone_swarm=65536,524288", "prospector=65536,262144"]
            sizing = ["--seconds", "0.5", "--threads", str(os.cpu_count() or 1)]
        command = [sys.executable, str(self.tree / "benchmarks" / "bench_gpu.py"), "--device",
                   self.device, "--plan", *plan, *sizing, "--json", str(result)]
        stage.status, _ = run_process(command, self.log, stage.budget, self.environment,
                                      self.tree)
        stage.result = {"rows": read_json(result) or []}
        if stage.status == "passed" and len(stage.result["rows"]) != sum(
                len(entry.split("=")[1].split(",")) for entry in plan):
            stage.status = "failed"

    def c_training(self, stage: Stage) -> None:
        sampler, samples = None, self.out / "d_gpu_samples.csv"
        if self.device == "cuda" and shutil.which("nvidia-smi"):
            with open(samples, "w") as handle:
                sampler = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used",
                     "--format=csv,noheader,nounits", "-lms", "250"],
                    stdout=handle, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self.child(stage, "training", self.out / "c_training.json")
        finally:
            if sampler is not None:
                _kill_group(sampler.pid)
                sampler.wait()
        runs = stage.result.get("runs", []) if stage.result else []
        if stage.status == "passed" and any(run.get("error") for run in runs):
            stage.status = "failed"
        checks = [run for run in runs if "passed" in run]
        if stage.status == "passed" and not self.args.tiny and not all(
                run["passed"] for run in checks):
            stage.status = "failed"
        if sampler is not None:
            utilisation = gpu_utilisation(samples, runs)
            self.stages["d_system"].result["during_c"] = utilisation

    # ---- the report ----
    def run(self) -> int:
        for name in ORDER:
            stage = self.stages[name]
            if name != "setup" and self.stages["setup"].status != "passed":
                stage.status = "skipped"
                stage.notes.append("setup did not pass")
                continue
            print(f"[acceptance] {name} (budget {stage.budget} s)", flush=True)
            started = time.monotonic()
            try:
                getattr(self, name)(stage)
            except Exception as error:          # recorded; the next stages still run
                stage.status = "error"
                stage.notes.append(f"{type(error).__name__}: {error}")
            stage.seconds = time.monotonic() - started
            print(f"[acceptance] {name}: {stage.status} in {stage.seconds:.1f} s", flush=True)
            self.write()
        summary = self.write()
        print(summary)
        if not self.args.keep_work and not self.args.work:
            shutil.rmtree(self.work, ignore_errors=True)
        passed = all(stage.status == "passed" for stage in self.stages.values())
        return 0 if passed else 1

    def write(self) -> str:
        report = {"device": self.device, "tiny": self.args.tiny,
                  "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started)),
                  "wall_seconds": round(time.time() - self.started, 1),
                  "budget_s": sum(BUDGET_S.values()),
                  "stages": {name: stage.as_dict() for name, stage in self.stages.items()}}
        report["targets"] = targets(report) if self.device == "cuda" else []
        write_atomically(self.out / "acceptance.json", json.dumps(report, indent=2, default=str))
        summary = markdown(report)
        write_atomically(self.out / "acceptance.md", summary)
        return summary


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def summarise_pytest(text: str) -> dict:
    """Counts from pytest's closing line, and the failed/errored/skipped test lines."""
    counts = {}
    closing = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    if closing:
        for count, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped)", closing[-1]):
            counts["errors" if kind.startswith("error") else kind] = int(count)
    lines = text.splitlines()
    return {**counts,
            "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))][:30],
            "skips": [line for line in lines if line.startswith("SKIPPED")][:30]}


def gpu_utilisation(samples: Path, runs: list[dict]) -> dict:
    """nvidia-smi samples (timestamp, util %, MiB used) during c: overall, and per run."""
    from datetime import datetime
    points = []
    for line in samples.read_text(errors="replace").splitlines():
        fields = [field.strip() for field in line.split(",")]
        try:
            moment = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            points.append((moment, float(fields[1]), float(fields[2])))
        except (ValueError, IndexError):
            continue

    def over(chosen):
        if not chosen:
            return {"samples": 0}
        return {"samples": len(chosen),
                "utilisation_mean": round(sum(p[1] for p in chosen) / len(chosen), 1),
                "utilisation_max": max(p[1] for p in chosen),
                "memory_used_max_mib": max(p[2] for p in chosen)}

    result = {"all": over(points)}
    for run in runs:
        if "start" in run and "end" in run:
            result[run["name"]] = over([p for p in points if run["start"] <= p[0] <= run["end"]])
    return result


# ---- targets and the Markdown summary -----------------------------------------------

def targets(report: dict) -> list[dict]:
    """The issue's GPU targets against what this run measured (never a verdict on
    figures that were not measured)."""
    rows = report["stages"]["b_env_throughput"]["result"].get("rows", []) \
        if report["stages"]["b_env_throughput"]["result"] else []
    runs = report["stages"]["c_training"]["result"].get("runs", []) \
        if report["stages"]["c_training"]["result"] else []

    def best_env(name):
        measured = [row for row in rows if row["env"] == name and row.get("gpu")]
        return max(measured, key=lambda row: row["gpu"]) if measured else None

    def best_training(env):
        measured = [run["sps"] for run in runs if run.get("env") == env and
                    run.get("kind") == "gpu_env" and run.get("sps")]
        return max(measured) if measured else None

    found = []
    cartpole, drones = best_env("cartpole"), best_env("drone_swarm")
    found.append(("CartPole env steps/s on the GPU", 10e9, cartpole and cartpole["gpu"]))
    found.append(("CartPole GPU / 16-core C batch", 10.0,
                  cartpole and cartpole["gpu"] / cartpole["cpu"]))
    found.append(("DroneSwarm GPU / C batch (agent steps)", 10.0,
                  drones and drones["gpu"] / drones["cpu"]))
    found.append(("CartPole training SPS, GPU envs", 10e6, best_training("cartpole")))
    found.append(("DroneSwarm training agent SPS, GPU envs", 5e6, best_training("drone_swarm")))
    return [{"target": name, "at_least": goal, "measured": value,
             "met": None if value is None else value >= goal} for name, goal, value in found]


def number(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) < 100:
        return f"{value:.2f}"
    return f"{value:,.0f}"


def markdown(report: dict) -> str:
    stages = report["stages"]
    lines = [f"# GPU acceptance ({'dry run, ' if report['tiny'] else ''}device {report['device']})",
             "", f"Started {report['started']}; {report['wall_seconds']} s of "
             f"{report['budget_s']} s budgeted.", "",
             "| stage | status | seconds | budget | notes |", "|---|---|---:|---:|---|"]
    for name, stage in stages.items():
        notes = "; ".join(stage["notes"])[:300]
        lines.append(f"| {name} | {stage['status']} | {stage['seconds']} | {stage['budget_s']} "
                     f"| {notes} |")
    system = stages["d_system"]["result"] or {}
    if system:
        lines += ["", "## d: system", ""]
        for key in ("gpu", "driver", "torch", "torch_cuda", "nvrtc", "cuda_bindings",
                    "nvidia_cuda_nvrtc", "python", "cpu_count", "host_compiler"):
            if key in system:
                lines.append(f"- {key}: {system[key]}")
        during = system.get("during_c", {})
        for run, usage in during.items():
            if usage.get("samples"):
                lines.append(f"- GPU during c ({run}): utilisation mean "
                             f"{usage['utilisation_mean']}% max {usage['utilisation_max']}%, "
                             f"memory max {usage['memory_used_max_mib']:.0f} MiB")
    tests = stages["a_tests"]["result"] or {}
    if tests:
        lines += ["", "## a: GPU tests", "",
                  f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, "
                  f"{tests.get('errors', 0)} errors, {tests.get('skipped', 0)} skipped"]
        lines += [f"- {line}" for line in tests.get("failures", []) + tests.get("skips", [])]
    rows = (stages["b_env_throughput"]["result"] or {}).get("rows", [])
    if rows:
        lines += ["", "## b: env-only throughput (agent steps/s)", "",
                  "| env | instances | C batch | device batch | device / C | C + copy |",
                  "|---|---:|---:|---:|---:|---:|"]
        for row in rows:
            ratio = row["gpu"] / row["cpu"] if row.get("gpu") else None
            lines.append(f"| {row['env']} | {row['instances']:,} | {number(row['cpu'])} | "
                         f"{number(row.get('gpu'))} | {number(ratio)} | "
                         f"{number(row.get('cpu_copy'))} |")
    runs = (stages["c_training"]["result"] or {}).get("runs", [])
    if runs:
        lines += ["", "## c: training", "",
                  "| run | SPS | updates timed | warm-up s | return | GPU memory peak MiB | "
                  "check |", "|---|---:|---:|---:|---:|---:|---|"]
        for run in runs:
            check = "" if "passed" not in run else ("not judged at tiny sizes" if report["tiny"]
                                                    else "passed" if run["passed"] else "FAILED")
            detail = run.get("error") or run.get("detail", "")
            lines.append(f"| {run['name']} | {number(run.get('sps'))} | "
                         f"{run.get('updates', '-')} | {number(run.get('warmup_seconds'))} | "
                         f"{number(run.get('recent_return'))} | "
                         f"{number(run.get('memory_peak_mib'))} | {check} {detail} |")
    if report.get("targets"):
        lines += ["", "## Targets (one H100)", "", "| target | at least | measured | met |",
                  "|---|---:|---:|---|"]
        for target in report["targets"]:
            met = {None: "not measured", True: "yes", False: "no"}[target["met"]]
            lines.append(f"| {target['target']} | {number(target['at_least'])} | "
                         f"{number(target['measured'])} | {met} |")
    return "\n".join(lines) + "\n"


# ---- the children (run inside the copy) -------------------------------------------------

def child_system(device: str) -> dict:
    import importlib.metadata as metadata
    import platform

    import torch
    info = {"python": sys.version.split()[0], "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cpu_count": os.cpu_count(),
            "machine": platform.machine()}
    for name in ("cuda-bindings", "nvidia-cuda-nvrtc", "numpy", "gymnasium"):
        try:
            info[name.replace("-", "_")] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name.replace("-", "_")] = None
    try:
        from peregrine.envs.gpu import compiler as gpu
        info["nvrtc"] = ".".join(map(str, gpu.nvrtc_version()))
    except Exception as error:             # absent NVRTC is a finding, not a crash
        info["nvrtc"] = f"unavailable: {error}"
    compiler = subprocess.run(["cc", "--version"], capture_output=True, text=True)
    info["host_compiler"] = compiler.stdout.splitlines()[0] if compiler.returncode == 0 else None
    if shutil.which("nvidia-smi"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                "clocks.max.sm", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
        info["nvidia_smi_query"] = query.stdout.strip()
        if query.returncode == 0 and query.stdout.strip():
            info["driver"] = query.stdout.split(",")[1].strip()
        info["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True,
                                            timeout=30).stdout
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, capability=f"{properties.major}.{properties.minor}",
                    multiprocessors=properties.multi_processor_count,
                    memory_gib=round(properties.total_memory / 2 ** 30, 1))
    return info


def training_plan(device: str, tiny: bool) -> list[dict]:
    """The runs of stage c, most important first (a timed-out stage keeps the first)."""
    cores = os.cpu_count() or 1
    if tiny:
        cartpole_big = [("vec.num_envs", 16), ("train.minibatch_size", 128)]
        drones_big = [("vec.num_envs", 4), ("train.horizon", 16), ("train.minibatch_size", 256),
                      ("train.update_epochs", 1)]
        seconds, solve_cap, learn_seconds, threads = 0.2, 4096, 1.0, 1
    else:
        # GPU-sized batches over the shipped configs: CartPole's fast config with 65,536
        # envs (1M samples per update, four minibatches); DroneSwarm's shipped config
        # with 4,096 instances (32,768 drone rows, 2M samples per update, its eight
        # minibatches and three epochs).
        cartpole_big = [("vec.num_envs", 65536), ("train.minibatch_size", 262144)]
        drones_big = [("vec.num_envs", 4096), ("train.minibatch_size", 262144)]
        seconds, solve_cap, learn_seconds, threads = 4.0, 8_000_000, 30.0, cores
    on_device = [("vec.backend", "device"), ("train.device", device)]
    split = [("vec.backend", "native"), ("vec.split", 2), ("vec.num_threads", threads),
             ("train.device", device)]
    all_cpu = [("vec.backend", "native"), ("vec.num_threads", threads),
               ("train.torch_threads", threads), ("train.device", "cpu")]
    runs = []
    for precision in ("fp32", "bf16"):
        runs.append(dict(name=f"cartpole gpu-env {precision}", env="cartpole", variant="fast",
                         kind="gpu_env", seconds=seconds,
                         overrides=[*cartpole_big, *on_device, ("train.precision", precision)]))
        runs.append(dict(name=f"drone_swarm gpu-env {precision}", env="drone_swarm",
                         variant=None, kind="gpu_env", seconds=seconds,
                         overrides=[*drones_big, *on_device, ("train.precision", precision)]))
    runs.append(dict(name="cartpole C-env split 2", env="cartpole", variant="fast",
                     kind="split", seconds=seconds, overrides=[*cartpole_big, *split]))
    runs.append(dict(name="drone_swarm C-env split 2", env="drone_swarm", variant=None,
                     kind="split", seconds=seconds, overrides=[*drones_big, *split]))
    runs.append(dict(name=f"cartpole all-CPU {threads} threads (fast config)", env="cartpole",
                     variant="fast", kind="cpu", seconds=seconds, overrides=all_cpu))
    runs.append(dict(name=f"drone_swarm all-CPU {threads} threads (shipped config)",
                     env="drone_swarm", variant=None, kind="cpu", seconds=seconds,
                     overrides=all_cpu))
    runs.append(dict(name="cartpole solves (fast config, device loop)", env="cartpole",
                     variant="fast", kind="solve", cap=solve_cap, seconds=60.0,
                     overrides=on_device))
    runs.append(dict(name="drone_swarm delivers more (shipped config, device loop)",
                     env="drone_swarm", variant=None, kind="learns", seconds=learn_seconds,
                     overrides=on_device))
    if not tiny:    # torch.compile: 10-30 s per graph; the dry run leaves it to test_train_compile
        for env, big in (("cartpole", cartpole_big), ("drone_swarm", drones_big)):
            for precision in ("fp32", "bf16"):
                runs.append(dict(name=f"{env} gpu-env {precision} compiled", env=env,
                                 variant="fast" if env == "cartpole" else None, kind="gpu_env",
                                 seconds=seconds, overrides=[*big, *on_device,
                                                             ("train.precision", precision),
                                                             ("train.compile", True)]))
    return runs


def child_training(device: str, tiny: bool, result_path: Path) -> dict:
    import torch

    from peregrine.train.config import load_config
    from peregrine.train.ppo import Trainer
    cuda = device == "cuda"
    results = {"runs": []}
    for plan in training_plan(device, tiny):
        run = {key: plan[key] for key in ("name", "env", "kind")}
        run["overrides"] = [list(pair) for pair in plan["overrides"]]
        run["start"] = time.time()
        try:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            config = load_config(plan["env"], plan["variant"], overrides=[
                *plan["overrides"], ("train.checkpoint_interval", 0),
                ("train.total_steps", plan.get("cap", 10 ** 12)),
                *([("train.stop_return", 0.0)] if plan["kind"] != "solve" else [])])
            trainer = Trainer(config)
            try:
                run.update(measure_run(trainer, plan, cuda, torch))
            finally:
                trainer.close()
            if cuda:
                run["memory_peak_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
        except Exception as error:            # recorded; the next run still goes
            run["error"] = f"{type(error).__name__}: {error}"
        run["end"] = time.time()
        results["runs"].append(run)
        write_atomically(result_path, json.dumps(results, indent=2, default=str))
        print(json.dumps({k: v for k, v in run.items() if k != "overrides"}, default=str),
              flush=True)
    return results


def measure_run(trainer, plan: dict, cuda: bool, torch) -> dict:
    def synchronise():
        if cuda:
            torch.cuda.synchronize()

    kind = plan["kind"]
    if kind == "solve":
        started = time.perf_counter()
        while not trainer.done and time.perf_counter() - started < plan["seconds"]:
            record = trainer.update()
            if (record["recent_return"] or 0) >= 475:
                break
        recent = trainer.recent_return()
        return {"steps": trainer.global_step, "seconds": time.perf_counter() - started,
                "recent_return": recent, "passed": recent is not None and recent >= 475,
                "detail": f"{trainer.global_step:,} steps, {time.perf_counter() - started:.1f} s"}
    if kind == "learns":
        delivered = []                       # (episodes, mean delivered) per update
        started = time.perf_counter()
        while time.perf_counter() - started < plan["seconds"]:
            record = trainer.update()
            if record["episodes_this_update"]:
                delivered.append((record["episodes_this_update"],
                                  record["env_stats"]["delivered"]))
        quarter = max(len(delivered) // 4, 1)

        def mean(part):
            count = sum(n for n, _ in part)
            return sum(n * d for n, d in part) / count if count else None

        first, last = mean(delivered[:quarter]), mean(delivered[-quarter:])
        return {"steps": trainer.global_step, "seconds": time.perf_counter() - started,
                "sps": trainer.global_step / (time.perf_counter() - started),
                "recent_return": trainer.recent_return(), "delivered_first": first,
                "delivered_last": last,
                "passed": first is not None and last is not None and last > first
                and len(delivered) >= 2,
                "detail": f"delivered {first if first is None else round(first, 3)} -> "
                          f"{last if last is None else round(last, 3)} over "
                          f"{trainer.global_step:,} steps"}
    started = time.perf_counter()
    trainer.update()                         # warm-up (and compilation) not timed
    synchronise()
    warmup = time.perf_counter() - started
    steps, updates, started = trainer.global_step, 0, time.perf_counter()
    while updates == 0 or time.perf_counter() - started < plan["seconds"]:
        trainer.update()
        updates += 1
    synchronise()
    elapsed = time.perf_counter() - started
    return {"sps": (trainer.global_step - steps) / elapsed, "updates": updates,
            "seconds": elapsed, "warmup_seconds": warmup,
            "recent_return": trainer.recent_return(),
            "compiled": getattr(trainer, "compiled", None)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="folder for the summary files")
    parser.add_argument("--wheels", help=f"folder of wheels to install (e.g. {WHEELS_DIR})")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the dry run's)")
    parser.add_argument("--dry-run", action="store_true", help="= --device cpu --tiny")
    parser.add_argument("--work", help="scratch folder (default: a new temporary one, removed "
                                       "at the end)")
    parser.add_argument("--keep-work", action="store_true")
    parser.add_argument("--print-download-command", action="store_true",
                        help="print the pip command that fills the wheel folder, and exit")
    parser.add_argument("--child", choices=["system", "training"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.print_download_command:
        print(download_command())
        return 0
    if args.dry_run:
        args.device, args.tiny = "cpu", True
    if args.child == "system":
        write_atomically(Path(args.result), json.dumps(child_system(args.device), indent=2))
        return 0
    if args.child == "training":
        child_training(args.device, args.tiny, Path(args.result))
        return 0
    if not args.out:
        parser.error("the output folder is required")
    return Acceptance(args).run()


if __name__ == "__main__":
    sys.exit(main())
