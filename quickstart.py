#!/usr/bin/env python3
"""Sets up Peregrine in ./.venv (once) and runs the main job or the tests.

    python3 quickstart.py train    # train an agent with the live dashboard
    python3 quickstart.py test     # run the whole test suite

Needs only Python 3.10+ and a C compiler. The virtual environment is created
on first use and reused; it is re-installed when the build inputs change.
torch is installed as the pinned CPU wheel first, so the package's torch
range is already satisfied and nothing pulls the CUDA build.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".peregrine-install-stamp"
TORCH = "torch==2.13.0"
# cuda: NVRTC, so the tests compile every env for the GPU; conformance: the third-party
# clients (TorchRL, SuperSuit) tests/test_conformance.py runs
EXTRAS = "train,test,pettingzoo,cuda,conformance"

COVERAGE_JSON = ROOT / ".coverage-summary.json"
# pytest-xdist workers: one per usable core, at most 4 (each holds its own torch, and
# the longest tests take a minute or more alone); one core runs the suite in-process
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKERS = min(CORES, 4) if CORES > 1 else 0
COMMANDS = {
    "train": ["-m", "peregrine.cli", "train", "cartpole", "--monitor"],
    # Line and branch coverage, subprocesses included ([tool.coverage] in
    # pyproject.toml); the table lists the files not fully covered. The fifteen
    # slowest tests are listed too: the suite's time is kept under ten minutes.
    # worksteal: each worker starts on a contiguous share of the tests (a module's
    # fixtures are mostly built once) and takes tests from another when it runs dry.
    "test": ["-m", "pytest", "-q", "-n", str(WORKERS), "--dist", "worksteal",
             "--durations=15", "--cov=peregrine",
             "--cov-report=term:skip-covered", f"--cov-report=json:{COVERAGE_JSON}"],
}


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def build_inputs_digest() -> str:
    digest = hashlib.sha256()
    paths = [ROOT / "pyproject.toml", ROOT / "setup.py"]
    # the C headers (each env's module is its header plus the binding; the _NAME.c
    # files beside them are written by the build itself, so they are no input)
    paths += sorted((ROOT / "src").rglob("*.h"))
    for path in paths:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def pip(*args: str) -> None:
    subprocess.check_call([str(venv_python()), "-m", "pip", "install", "--quiet", *args])


def ensure_installed() -> None:
    if sys.version_info < (3, 10):
        sys.exit(f"Peregrine needs Python 3.10+, this is {sys.version.split()[0]}")
    if not venv_python().exists():
        print(f"creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = build_inputs_digest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    print("installing Peregrine and its dependencies (first run takes a few minutes)", flush=True)
    pip(TORCH)
    pip("setuptools>=77", "wheel")
    pip("--no-build-isolation", "-e", f"{ROOT}[{EXTRAS}]")
    STAMP.write_text(digest)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__)
        return 2
    ensure_installed()
    command = [str(venv_python()), *COMMANDS[sys.argv[1]], *sys.argv[2:]]
    COVERAGE_JSON.unlink(missing_ok=True)
    status = subprocess.call(command, cwd=ROOT)
    if sys.argv[1] == "test" and COVERAGE_JSON.exists():
        print_coverage_totals()
    return status


def print_coverage_totals() -> None:
    """Lines and branches apart (coverage's own total mixes the two)."""
    import json
    totals = json.loads(COVERAGE_JSON.read_text())["totals"]
    lines = 100 * totals["covered_lines"] / max(totals["num_statements"], 1)
    branches = 100 * totals["covered_branches"] / max(totals["num_branches"], 1)
    print(f"coverage of src/peregrine, subprocesses included: lines {lines:.1f}% "
          f"({totals['covered_lines']}/{totals['num_statements']}), branches {branches:.1f}% "
          f"({totals['covered_branches']}/{totals['num_branches']})")


if __name__ == "__main__":
    sys.exit(main())
