"""Builds every native env with ASan + UBSan and runs the fuzzer under them.

The sanitized extensions go to a temporary copy of the package; the fuzzer
runs in a subprocess with libasan preloaded (Python itself is not
instrumented; leak detection is off because CPython's allocations at exit
are not leaks). Any out-of-bounds access, use-after-free, signed overflow or
other undefined behaviour in C aborts the subprocess and fails the test.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def sanitizer_runtime():
    compiler = shutil.which("gcc")
    if not compiler:
        return None
    path = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.slow
@pytest.mark.skipif(sanitizer_runtime() is None, reason="gcc with libasan not available")
def test_native_envs_under_asan_and_ubsan(tmp_path):
    package = tmp_path / "peregrine"
    shutil.copytree(ROOT / "src" / "peregrine", package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = dict(os.environ, PEREGRINE_SANITIZE="1")
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path),
         "--build-temp", str(tmp_path / "build")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    assert list(package.rglob("*.so")), "no sanitized extension was built"

    env = dict(os.environ, LD_PRELOAD=sanitizer_runtime(), PYTHONPATH=str(tmp_path),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    env.pop("PEREGRINE_SANITIZE", None)
    # The fuzzer imports a copy of the package: a coverage run must not count it
    # as a second tree (quickstart's test command measures subprocesses).
    for name in [name for name in env if name.startswith("COVERAGE_")]:
        env.pop(name)
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz_native.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-5000:]
    assert "ERROR: AddressSanitizer" not in report and "runtime error" not in report, report[-5000:]
    from peregrine.envs.registry import BUILT_IN     # the shipped envs (see fuzz_native.py)
    for name in BUILT_IN:
        assert f"{name}:" in run.stdout, f"{name} was not fuzzed:\n{report[-3000:]}"
