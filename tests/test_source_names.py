"""Every name a source file uses is defined: pyflakes over the package, the
benchmarks, the tests and the top-level scripts. The benchmarks are scripts that
no test runs end to end, so an undefined name there (a constant deleted in a
refactor) would otherwise surface only when someone next runs them."""
from __future__ import annotations

from pathlib import Path

import pytest

checker = pytest.importorskip("pyflakes.checker")
api = pytest.importorskip("pyflakes.api")
messages = pytest.importorskip("pyflakes.messages")

ROOT = Path(__file__).resolve().parents[1]
# What would fail at run time; style findings (unused imports or variables) are not
# this test's business.
FATAL = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect:
    def __init__(self):
        self.found = []

    def flake(self, message):
        if isinstance(message, FATAL):
            self.found.append(str(message))

    def unexpectedError(self, filename, problem):   # noqa: N802 - pyflakes' reporter API
        self.found.append(f"{filename}: {problem}")

    def syntaxError(self, filename, msg, lineno, offset, text):   # noqa: N802
        self.found.append(f"{filename}:{lineno}: {msg}")


def test_no_source_file_uses_an_undefined_name():
    files = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
             *sorted((ROOT / "tests").glob("*.py")), ROOT / "quickstart.py", ROOT / "setup.py"]
    reporter = _Collect()
    for path in files:
        api.checkPath(str(path), reporter)
    assert len(files) > 50
    assert reporter.found == []
