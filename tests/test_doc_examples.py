"""The Python examples of README.md and the documentation pages run as written.

Every ```python block of README.md and docs/*.md runs in a fresh interpreter (its own
temporary working directory, the test's environment, PYTHONPATH included) and must exit 0.
A block that cannot run here (it needs a GPU, a network, a long training or a file the
reader supplies) says so in the Markdown, on the last non-blank line before its fence:

    <!-- doc-test: skip (needs a CUDA GPU) -->

and is reported as skipped with that reason (``pytest -rs`` lists them). A block with no
marker must run. Bash and TOML blocks are not examined.
"""
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 60

# An opening fence (possibly indented, inside a list or an admonition) and its language.
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
SKIP = re.compile(r"^[ \t]*<!--[ \t]*doc-test:[ \t]*skip[ \t]*\((?P<reason>[^)]+)\)[ \t]*-->[ \t]*$")
# Anything that looks like a doc-test marker, well formed or not, so a typo cannot hide a block.
ANY_MARKER = re.compile(r"<!--[ \t]*doc-test")


@dataclass
class Block:
    page: Path
    line: int                 # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None          # the reason given by a skip marker, or None

    @property
    def id(self):
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def extract(text: str, page: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a Markdown text, with their skip markers, and the problems
    found with the markers (a malformed one, or one not followed by a Python block)."""
    lines = text.splitlines()
    blocks, problems = [], []
    pending = None            # (line, reason) of a marker still waiting for its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        opening = FENCE.match(line)
        if opening:
            indent, ticks, lang = opening["indent"], opening["ticks"], opening["lang"].lower()
            # The closing fence: the same character, at least as many, nothing after it.
            closing = re.compile(rf"^[ \t]*{re.escape(ticks[0])}{{{len(ticks)},}}[ \t]*$")
            end = i + 1
            while end < len(lines) and not closing.match(lines[end]):
                end += 1
            body = [row[len(indent):] if row.startswith(indent) else row.lstrip()
                    for row in lines[i + 1:end]]
            reason = pending[1] if pending else None
            if pending and lang != "python":
                problems.append(f"{page.name}:{pending[0]}: skip marker before a {lang or 'plain'} block")
            blocks.append(Block(page, i + 1, lang, "\n".join(body) + "\n", reason))
            pending = None
            i = end + 1
            continue
        if ANY_MARKER.search(line):
            marker = SKIP.match(line)
            if marker is None:
                problems.append(f"{page.name}:{i + 1}: malformed marker {line.strip()!r}")
            elif pending:
                problems.append(f"{page.name}:{pending[0]}: skip marker with no block after it")
            pending = (i + 1, marker["reason"].strip()) if marker else None
        elif line.strip() and pending:
            # Only blank lines may stand between a marker and its fence.
            problems.append(f"{page.name}:{pending[0]}: skip marker with no block right after it")
            pending = None
        i += 1
    if pending:
        problems.append(f"{page.name}:{pending[0]}: skip marker with no block after it")
    return blocks, problems


def python_blocks():
    found = []
    for page in PAGES:
        blocks, _ = extract(page.read_text(), page)
        found += [block for block in blocks if block.lang == "python"]
    return found


BLOCKS = python_blocks()


def test_the_pages_have_python_examples():
    # A parsing slip that found nothing would otherwise pass every test below vacuously.
    assert len(BLOCKS) >= 5
    assert any(block.page.name == "README.md" and block.skip is None for block in BLOCKS)


def test_every_marker_belongs_to_a_python_block():
    problems = [problem for page in PAGES for problem in extract(page.read_text(), page)[1]]
    assert problems == []


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_the_example_runs(block, tmp_path):
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    script = tmp_path / "example.py"
    script.write_text(block.code)
    # The test's own environment (PYTHONPATH included); the example is a script of its own,
    # so `if __name__ == "__main__":` guards run.
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=dict(os.environ),
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, (
        f"{block.id} exited {result.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}")


# The extractor itself, on small texts whose blocks are known.

def test_extract_finds_markers_fences_and_indented_blocks(tmp_path):
    text = "\n".join([
        "# Page",
        "```bash",
        "echo <!-- not a marker, inside a block -->",
        "```",
        "<!-- doc-test: skip (needs a GPU) -->",
        "",
        "```python",
        "import torch",
        "```",
        "- a list item:",
        "",
        "    ```python",
        "    x = 1",
        "        y = 2",
        "    ```",
        "````python",
        "print('```')",
        "````",
    ])
    blocks, problems = extract(text, tmp_path / "page.md")
    assert problems == []
    assert [(b.line, b.lang, b.skip) for b in blocks] == [
        (2, "bash", None), (7, "python", "needs a GPU"), (12, "python", None), (16, "python", None)]
    assert blocks[2].code == "x = 1\n    y = 2\n"
    assert blocks[3].code == "print('```')\n"


@pytest.mark.parametrize("text, problem", [
    ("<!-- doc-test: skip -->\n```python\npass\n```", "malformed marker"),
    ("<!-- doc-test: skip (gpu) -->\nSome text.\n```python\npass\n```", "no block right after it"),
    ("<!-- doc-test: skip (gpu) -->\n```bash\nls\n```", "before a bash block"),
    ("```python\npass\n```\n<!-- doc-test: skip (gpu) -->\n", "no block after it"),
])
def test_extract_refuses_stray_or_malformed_markers(text, problem, tmp_path):
    blocks, problems = extract(text, tmp_path / "page.md")
    assert len(problems) == 1 and problem in problems[0]
    # A malformed or misplaced marker skips nothing.
    assert all(block.skip is None for block in blocks if block.lang == "python")
