"""Published figures come from benchmarks/figures/*.toml through benchmarks/figures.py."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import figures  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "figures.py"


def copy_repo(tmp_path: Path) -> Path:
    """The data files and every document that may carry spans, in the repository's layout."""
    shutil.copytree(ROOT / "benchmarks" / "figures", tmp_path / "benchmarks" / "figures")
    for path in figures.documents(ROOT):
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return tmp_path


def spans(root: Path, name: str) -> list[str]:
    """The current text of every span that shows figure NAME across the documents: its own spans
    (any kind) and the table spans whose rows name it."""
    _, tables = figures.load(root / "benchmarks" / "figures")
    showing = {table for table, data in tables.items()
               if any("{" + name + "}" in str(cell) or "{" + name + ".value}" in str(cell)
                      for row in data.get("row", []) for cell in row.values())}
    found = []
    for path in figures.documents(root):
        found += [m.group(3) for m in figures.SPAN.finditer(path.read_text())
                  if m.group(2) == name or (m.group(1) == "table" and m.group(2) in showing)]
    return found


def set_value(root: Path, name: str, value: str) -> None:
    path = next(p for p in (root / "benchmarks" / "figures").glob("*.toml") if f"[figure.{name}]" in p.read_text())
    text = path.read_text()
    new = re.sub(rf"(\[figure\.{name}\]\nvalue = )[^\n]*", rf"\g<1>{value}", text)
    assert new != text
    path.write_text(new)


def test_documents_are_in_sync_with_the_data():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_disagreeing_figures_are_spans_in_every_document():
    # Issue 36's figures: each shown from one data entry wherever it appears.
    assert len(spans(ROOT, "cartpole_solve_steps")) >= 3      # docs Training, Results, cartpole.toml
    assert len(spans(ROOT, "cartpole_fast_solve_steps")) >= 3  # docs Training, Results, cartpole-fast.toml
    assert len(spans(ROOT, "drone_swarm_shipped_train_seconds")) >= 3
    assert len(spans(ROOT, "cartpole_env_sps_2t")) >= 3       # env table (value + where), Results table


def test_a_changed_value_changes_every_span_that_shows_it(tmp_path):
    root = copy_repo(tmp_path)
    before = spans(root, "cartpole_solve_steps")
    set_value(root, "cartpole_solve_steps", "[11.1, 22.2]")
    stale = figures.sync(root)
    shown = [line for line in stale if line.endswith((" cartpole_solve_steps", " table results"))]
    assert len(shown) == len(before) and len(stale) == len(before), stale
    assert any(line.startswith("docs/results.md:") and line.endswith(" table results") for line in shown)
    assert any(line.startswith("src/peregrine/train/configs/cartpole.toml:") for line in shown)

    assert figures.sync(root, write=True) == stale
    after = spans(root, "cartpole_solve_steps")
    assert len(after) == len(before)
    assert all("11.1k-22.2k steps" in text and "25.6k-51.2k" not in text for text in after), after
    assert figures.sync(root) == []  # written, now in sync
    # The CLI says the same: in sync now, and exit 1 naming the span after a data change.
    assert subprocess.run([sys.executable, str(SCRIPT), "--check", "--root", str(root)]).returncode == 0
    set_value(root, "cartpole_solve_steps", "[11.1, 33.3]")
    result = subprocess.run([sys.executable, str(SCRIPT), "--check", "--root", str(root)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "README.md:" in result.stdout and "cartpole_solve_steps" in result.stdout


def test_a_changed_value_changes_a_table_that_shows_it(tmp_path):
    root = copy_repo(tmp_path)
    (root / "benchmarks" / "figures" / "tables.toml").write_text(
        '[table.t]\ncolumns = ["what", "result"]\n'
        '[[table.t.row]]\nwhat = "CartPole"\nresult = "solves in {cartpole_solve_steps}, {cartpole_env_sps_2t.value}"\n')
    doc = root / "docs" / "t.md"
    doc.write_text("before\n<!-- table: t -->\n<!-- /table -->\nafter\n")
    figures.sync(root, write=True)
    table = doc.read_text()
    assert "| what | result | measured on |" in table
    assert "| CartPole | solves in 25.6k-51.2k steps (seeds 1-5), 453M steps/s |" in table
    assert "2026-11-26" in table and "2026-11-21" in table  # both figures' dates
    set_value(root, "cartpole_env_sps_2t", "111.0")
    stale = figures.sync(root)
    assert "docs/t.md:2 table t" in stale
    assert "docs/environments.md" in " ".join(stale)  # its env table and Results table show the figure too
    assert "README.md" in " ".join(stale)  # and its headline results
    assert all(line.endswith((" cartpole_env_sps_2t", " table results")) for line in stale if line != "docs/t.md:2 table t")
    figures.sync(root, write=True)
    assert "solves in 25.6k-51.2k steps (seeds 1-5), 111M steps/s |" in doc.read_text()
    assert doc.read_text().startswith("before\n") and doc.read_text().endswith("after\n")


@pytest.mark.parametrize("field", ["date", "commit", "command", "cores", "cpu"])
def test_an_entry_without_its_provenance_is_a_clear_error(tmp_path, field):
    root = copy_repo(tmp_path)
    path = root / "benchmarks" / "figures" / "training.toml"
    text = path.read_text()
    block = text.index("[figure.cartpole_solve_steps]")
    line = re.compile(rf"^{field} = [^\n]*\n", re.MULTILINE).search(text, block)
    path.write_text(text[:line.start()] + text[line.end():])
    with pytest.raises(figures.FigureError, match=rf"training.toml: figure 'cartpole_solve_steps' lacks {field}"):
        figures.sync(root)
    result = subprocess.run([sys.executable, str(SCRIPT), "--check", "--root", str(root)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "cartpole_solve_steps" in result.stderr and field in result.stderr


def test_a_range_must_say_what_it_is_over_and_names_must_exist(tmp_path):
    root = copy_repo(tmp_path)
    path = root / "benchmarks" / "figures" / "training.toml"
    path.write_text(path.read_text().replace('over = "seeds 1-5"\n', "", 1))
    with pytest.raises(figures.FigureError, match="cartpole_solve_steps.*over"):
        figures.load(root / "benchmarks" / "figures")
    shutil.copy(ROOT / "benchmarks" / "figures" / "training.toml", path)
    (root / "docs" / "x.md").write_text("<!-- figure: no_such_figure --><!-- /figure -->\n")
    with pytest.raises(figures.FigureError, match="no figure 'no_such_figure'"):
        figures.sync(root)


def test_rendering():
    entry = dict(cpu="AMD EPYC", cores=2, date="2026-11-24", commit="x", command="c")
    several = figures.Figure("f", dict(entry, value={"list": [19.2, 19.8, 20.5]}, over="seeds 1-3"), "t")
    assert several.value() == "19.2, 19.8 and 20.5"
    assert several.inline() == "19.2, 19.8 and 20.5 (seeds 1-3; 2-core AMD EPYC, 2026-11-24)"
    gpu = figures.Figure("g", dict(entry, gpu="NVIDIA H200", value=21.1, suffix="G", unit="steps/s"), "t")
    assert gpu.inline() == "21.1G steps/s (NVIDIA H200, 2026-11-24)"


def test_measured_on_names_each_machine_once_with_its_dates():
    entry = dict(value=1.0, commit="x", command="c")
    xeon = dict(entry, cpu="Intel Xeon", cores=2)
    used = [figures.Figure("a", dict(xeon, date="2026-11-26"), "t"),
            figures.Figure("b", dict(entry, gpu="NVIDIA H200", date="2026-11-27"), "t"),
            figures.Figure("c", dict(xeon, date="2026-11-21"), "t"),
            figures.Figure("d", dict(xeon, date="2026-11-26"), "t")]
    assert figures.measured_on(used) == "2-core Intel Xeon, 2026-11-21 and 2026-11-26; NVIDIA H200, 2026-11-27"


def test_the_results_table_is_generated_from_the_data():
    results = (ROOT / "docs" / "results.md").read_text()
    tables = [m for m in figures.SPAN.finditer(results) if m.group(1) == "table"]
    assert [m.group(2) for m in tables] == ["results"]
    # No table row of the section lies outside the generated span, and every row names where it was measured.
    outside = results[:tables[0].start()] + results[tables[0].end():]
    assert not [line for line in outside.splitlines() if line.startswith("|")]
    rows = tables[0].group(3).strip().splitlines()[2:]
    assert len(rows) >= 20 and all(re.search(r"\d{4}-\d{2}-\d{2}$", row.rstrip(" |")) for row in rows)
