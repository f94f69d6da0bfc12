"""The documentation site builds with no broken link, anchor or API reference, and
the README stays what a newcomer reads first."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    # mkdocs.yml sets strict and turns missing pages and anchors into warnings, so any of them
    # fails the build; --strict says so again in case the file is changed.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    # The API reference is generated from the docstrings, and the pages include README's
    # marked parts (the quick start, the GPU acceptance commands) rather than copy them.
    assert 'id="peregrine.make"' in (site / "api" / "peregrine" / "index.html").read_text()
    assert 'id="peregrine.vector.Multiprocessing"' in (site / "api" / "vector" / "index.html").read_text()
    assert "quickstart.py" in (site / "index.html").read_text()
    assert "--wheels .gpu-wheels" in (site / "gpu" / "index.html").read_text()
    assert "--8&lt;--" not in (site / "gpu" / "index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path):
    pytest.importorskip("mkdocs")
    # The same check against a page with a link to a heading that does not exist.
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# A\n\n[gone](b.md#no-such-heading)\n")
    (docs / "b.md").write_text("# B\n")
    config = (ROOT / "mkdocs.yml").read_text()
    validation = config[config.index("validation:"):config.index("markdown_extensions:")]
    (tmp_path / "mkdocs.yml").write_text(f"site_name: t\nstrict: true\n{validation}")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "no-such-heading" in result.stdout + result.stderr
