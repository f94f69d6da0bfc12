"""Every published figure from one place: render the data in benchmarks/figures/ into the documents.

A figure is one measured quantity in a data file `benchmarks/figures/*.toml`:

    [figure.cartpole_solve_steps]
    value = [25.6, 51.2]        # a number, [low, high] (a range) or {list = [...]} (several)
    suffix = "k"                # after each number ("k", "M", "x"); optional
    unit = "steps"              # after the whole value; optional
    over = "seeds 1-5"          # what a range or list is over (required for both)
    cpu = "AMD EPYC"            # the machine: CPU model (or "not recorded") and cores;
    cores = 2                   #   gpu = "NVIDIA H200" where a GPU ran it
    date = "2026-11-26"
    commit = "1234abc"          # the commit that recorded the measurement in RESULTS.md
    command = "benchmarks/bench_train.py"
    source = "RESULTS.md, ..."  # the section it comes from (and which of two, if two)

Tables are rows of text in which `{name}` stands for a figure (its value, unit and,
in parentheses, what it is over) and `{name.value}` for the bare value and unit;
a table gets a "measured on" column naming the machine and date of every figure in
the row. Documents show them between markers, on one line for figures (TOML
comment lines included) and across lines for tables:

    <!-- figure: NAME -->...<!-- /figure -->   value, unit, (over; machine, date)
    <!-- value: NAME -->...<!-- /value -->     value and unit (the context says where)
    <!-- where: NAME -->...<!-- /where -->     the machine and date only
    <!-- table: NAME -->...<!-- /table -->

    python benchmarks/figures.py --write   # rewrite every marked span from the data
    python benchmarks/figures.py --check   # exit 1 naming each span that differs
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "benchmarks" / "figures"
# The documents that may carry marked spans (relative to the repository root).
DOCUMENT_GLOBS = ("README.md", "docs/*.md", "src/peregrine/train/configs/*.toml")

REQUIRED = ("value", "date", "commit", "command")
# A span: its kind, the name it shows, its current text. The closing marker must
# repeat the kind, so a figure span never swallows a table's end.
SPAN = re.compile(r"<!-- (figure|value|where|table): ([A-Za-z0-9_]+) -->(.*?)<!-- /\1 -->", re.DOTALL)
PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_]+)(\.value)?\}")


class FigureError(ValueError):
    """A malformed data file, an unknown name or an unrenderable span."""


def _and(items: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


@dataclass(frozen=True)
class Figure:
    name: str
    entry: dict
    origin: str  # the data file, for error messages

    def number(self, x) -> str:
        digits = self.entry.get("digits")
        text = f"{x:.{digits}f}" if digits is not None else (f"{x:,}" if isinstance(x, int) else repr(x))
        return text + self.entry.get("suffix", "")

    def value(self) -> str:
        """The value and its unit: `453M steps/s`, `25.6k-51.2k steps`, `19.2, 19.8 and 20.5`."""
        v = self.entry["value"]
        if isinstance(v, dict):
            parts = [self.number(x) for x in v["list"]]
            text = _and(parts)
        elif isinstance(v, list):
            text = "-".join(self.number(x) for x in v)
        else:
            text = self.number(v)
        unit = self.entry.get("unit")
        return f"{text} {unit}" if unit else text

    def machine(self) -> str:
        """`2-core AMD EPYC`, or the GPU's name where a GPU ran it."""
        e = self.entry
        return e["gpu"] if "gpu" in e else f"{e['cores']}-core {e['cpu']}"

    def where(self) -> str:
        """The machine and date, compactly: `2-core AMD EPYC, 2026-11-26`."""
        return f"{self.machine()}, {self.entry['date']}"

    def in_table(self) -> str:
        over = self.entry.get("over")
        return f"{self.value()} ({over})" if over else self.value()

    def inline(self) -> str:
        over = self.entry.get("over")
        return f"{self.value()} ({over + '; ' if over else ''}{self.where()})"


def _check_entry(name: str, entry: dict, origin: str) -> None:
    missing = [key for key in REQUIRED if key not in entry]
    if "gpu" not in entry:
        missing += [key for key in ("cpu", "cores") if key not in entry]
    if missing:
        raise FigureError(f"{origin}: figure {name!r} lacks {', '.join(missing)} (every figure names "
                          "its value, machine (cpu and cores, or gpu), date, commit and command)")
    v = entry["value"]
    several = isinstance(v, list) or isinstance(v, dict)
    if isinstance(v, list) and len(v) != 2:
        raise FigureError(f"{origin}: figure {name!r}: a range is [low, high], got {v!r}")
    if isinstance(v, dict) and not v.get("list"):
        raise FigureError(f"{origin}: figure {name!r}: several values are {{list = [...]}}, got {v!r}")
    numbers = v if isinstance(v, list) else v.get("list", []) if isinstance(v, dict) else [v]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
        raise FigureError(f"{origin}: figure {name!r}: values must be numbers, got {v!r}")
    if several and not entry.get("over"):
        raise FigureError(f"{origin}: figure {name!r} is a range or list: say what it is over (`over`)")


def load(data_dir: Path = DATA_DIR) -> tuple[dict[str, Figure], dict[str, dict]]:
    """Every figure and table in the data files, checked; a name may be defined once."""
    figures: dict[str, Figure] = {}
    tables: dict[str, dict] = {}
    for path in sorted(data_dir.glob("*.toml")):
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise FigureError(f"{path.name}: {exc}") from None
        for name, entry in data.get("figure", {}).items():
            if name in figures:
                raise FigureError(f"{path.name}: figure {name!r} is already defined in {figures[name].origin}")
            _check_entry(name, entry, path.name)
            figures[name] = Figure(name, entry, path.name)
        for name, table in data.get("table", {}).items():
            if name in tables:
                raise FigureError(f"{path.name}: table {name!r} is defined twice")
            tables[name] = table
    for name, table in tables.items():  # placeholders must name figures
        for row in table.get("row", []):
            for match in PLACEHOLDER.finditer(" ".join(str(v) for v in row.values())):
                if match.group(1) not in figures:
                    raise FigureError(f"table {name!r}: unknown figure {{{match.group(1)}}}")
    return figures, tables


def _fill(text: str, figures: dict[str, Figure], used: list[Figure]) -> str:
    def replace(match: re.Match) -> str:
        figure = figures[match.group(1)]
        used.append(figure)
        return figure.value() if match.group(2) else figure.in_table()
    return PLACEHOLDER.sub(replace, text)


def measured_on(used: list[Figure]) -> str:
    """Where and when a row's figures were measured, one entry per machine with its dates:
    `2-core Intel Xeon, 2026-11-26; 2-core vCPU (model not recorded), 2026-11-23 and 2026-11-24`."""
    dates: dict[str, set[str]] = {}
    for figure in used:  # machines in the order the row shows them
        dates.setdefault(figure.machine(), set()).add(figure.entry["date"])
    return "; ".join(f"{machine}, {_and(sorted(days))}" for machine, days in dates.items())


def render_table(name: str, table: dict, figures: dict[str, Figure]) -> str:
    """A Markdown table with a last column, "measured on", naming the machines and dates of each row's figures."""
    columns = table["columns"]
    lines = ["| " + " | ".join(columns + ["measured on"]) + " |", "|" + "---|" * (len(columns) + 1)]
    for row in table.get("row", []):
        used: list[Figure] = []
        cells = [_fill(str(row.get(column, "")), figures, used) for column in columns]
        if not used:
            raise FigureError(f"table {name!r}: the row {cells[0]!r} shows no figure")
        cells.append(measured_on(used))
        lines.append("| " + " | ".join(cell.replace("\n", " ") for cell in cells) + " |")
    return "\n" + "\n".join(lines) + "\n"


def render(kind: str, name: str, figures: dict[str, Figure], tables: dict[str, dict]) -> str:
    if kind == "table":
        if name not in tables:
            raise FigureError(f"no table {name!r} in {DATA_DIR.relative_to(ROOT)}")
        return render_table(name, tables[name], figures)
    if name not in figures:
        raise FigureError(f"no figure {name!r} in {DATA_DIR.relative_to(ROOT)}")
    figure = figures[name]
    return {"figure": figure.inline, "value": figure.value, "where": figure.where}[kind]()


def documents(root: Path = ROOT) -> list[Path]:
    return sorted({path for pattern in DOCUMENT_GLOBS for path in root.glob(pattern)})


def sync(root: Path = ROOT, data_dir: Path | None = None, write: bool = False) -> list[str]:
    """Compare (and with `write`, rewrite) every marked span; returns `FILE:LINE kind NAME` per stale span."""
    figures, tables = load(data_dir or root / "benchmarks" / "figures")
    stale = []
    for path in documents(root):
        text = path.read_text()
        if "<!-- " not in text:
            continue

        def replace(match: re.Match) -> str:
            kind, name, current = match.groups()
            wanted = render(kind, name, figures, tables)
            if current != wanted:
                line = text.count("\n", 0, match.start()) + 1
                stale.append(f"{path.relative_to(root)}:{line} {kind} {name}")
            return f"<!-- {kind}: {name} -->{wanted}<!-- /{kind} -->"

        new = SPAN.sub(replace, text)
        if write and new != text:
            path.write_text(new)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every marked span from the data")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each span that differs")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (documents and data)")
    args = parser.parse_args(argv)
    try:
        stale = sync(args.root, write=args.write)
    except FigureError as exc:
        print(f"figures: {exc}", file=sys.stderr)
        return 2
    for span in stale:
        print(f"{'rewrote' if args.write else 'differs from its data'}: {span}")
    if args.check and stale:
        print(f"{len(stale)} span(s) out of date: run python benchmarks/figures.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
