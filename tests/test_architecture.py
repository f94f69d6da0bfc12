"""The layers of README's "Architecture", as the import contract in pyproject.toml.

`lint-imports` (import-linter) checks that no module imports a layer above its
own and that every top-level module has a place in the contract. The second
test proves the guard bites: an upward import added to a copy of the sources
breaks the contract, and the message names both modules.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("importlinter", reason="import-linter is in the test extra")


def lint_imports(python_path: Path) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = {**os.environ, "PYTHONPATH": str(python_path)}
    return subprocess.run([sys.executable, "-c", code, str(ROOT / "pyproject.toml"),
                           "--no-cache"], capture_output=True, text=True, env=env, cwd=ROOT)


def test_the_sources_keep_every_layer_contract():
    result = lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def copy_sources(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "peregrine", source / "peregrine",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.c", "*.h"))
    return source


def add_import(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


@pytest.mark.parametrize("module, line, edge", [
    # the trainer reaching up for the policy catalogue (the old teacher import)
    ("train/kickstart.py", "from ..policies import make_policy", "peregrine.train.kickstart -> peregrine.policies"),
    # the GPU compiler asking the registry (the old import circle)
    ("envs/gpu/compiler.py", "from ..registry import list_envs", "peregrine.envs.gpu.compiler -> peregrine.envs.registry"),
    # a lower layer importing a command-line module
    ("vector/export.py", "from ..cli.render import run", "peregrine.vector.export -> peregrine.cli.render"),
])
def test_an_upward_import_breaks_the_contract_naming_both_modules(tmp_path, module, line, edge):
    source = copy_sources(tmp_path)
    add_import(source / "peregrine" / module, line)
    result = lint_imports(source)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and edge in result.stdout, result.stdout


def test_a_new_top_level_module_must_take_a_place(tmp_path):
    source = copy_sources(tmp_path)
    (source / "peregrine" / "helpers.py").write_text("X = 1\n")
    result = lint_imports(source)
    assert result.returncode != 0
    assert "peregrine.helpers" in result.stdout, result.stdout


def test_files_reach_disk_whole_through_one_helper():
    """Every write-then-rename in the package is peregrine.files.written_atomically:
    a second hand-kept copy of the temporary name or the cleanup would drift (the
    run directory's cleaner reads the name from there)."""
    renames = [f"{path.relative_to(ROOT)}:{number}"
               for path in sorted((ROOT / "src" / "peregrine").rglob("*.py"))
               if path.name != "files.py" or path.parent.name != "peregrine"
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if "os.replace(" in line or "os.rename(" in line]
    assert renames == [], renames
