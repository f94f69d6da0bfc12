"""Multiprocessing from a plain script: a missing `if __name__ == "__main__":` guard
is refused with an error that says what to do, before any worker starts."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import peregrine
from peregrine.vector.processes import _line_is_guarded

SOURCE = str(Path(peregrine.__file__).resolve().parents[1])
MAKE = ('env = pv.make("cartpole", backend="multiprocessing", num_envs=2, num_workers=1, '
        'start_method={method!r})\nenv.reset(seed=0)\nprint("made", flush=True)\nenv.close()\n')


def run_script(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train_script.py"
    script.write_text("import peregrine.vector as pv\n" + body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SOURCE, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unguarded_script_gets_one_clear_error_and_no_workers(tmp_path, method):
    result = run_script(tmp_path, MAKE.format(method=method))
    assert result.returncode == 1
    assert "train_script.py (line 2)" in result.stderr
    assert 'if __name__ == "__main__":' in result.stderr
    assert result.stderr.count("Traceback") == 1          # the parent's, not one per worker
    assert "bootstrapping phase" not in result.stderr      # multiprocessing's raw refusal
    assert "made" not in result.stdout


def test_unguarded_call_through_a_function_is_found_too(tmp_path):
    body = "def main():\n" + textwrap.indent(MAKE.format(method="spawn"), "    ") + "main()\n"
    result = run_script(tmp_path, body)
    assert result.returncode == 1 and "(line 7)" in result.stderr, result.stderr


def test_guarded_script_runs(tmp_path):
    body = ('if __name__ == "__main__":\n'
            + textwrap.indent(MAKE.format(method="spawn"), "    "))
    result = run_script(tmp_path, body)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "made"


def test_guard_detection_reads_the_script():
    tree = ast.parse(textwrap.dedent("""\
        import x
        x.run()
        if __name__ == "__main__":
            x.run()
        if "__main__" == __name__:
            x.run()
        if x.flag:
            x.run()
        def f():
            x.run()
        """))
    assert [line for line in range(1, 11) if _line_is_guarded(tree, line)] == [3, 4, 5, 6, 9, 10]
