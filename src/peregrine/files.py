"""Files that are whole or absent: every file Peregrine writes that a reader or
a user may already hold (checkpoints, compiled envs and kernels, the metrics
file, GIFs, plots, JSON records, sweep exports) goes through
`written_atomically`, the one place that knows how: written under a temporary
name beside the target and renamed over it only when complete, so an
interruption (a crash, Ctrl-C, a full disk) never leaves a truncated file, and a
concurrent reader sees the old file or the new one, never half of one.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def partial_prefix(name: str) -> str:
    """How the temporary file of a write to `name` begins (a dot, so it is hidden,
    then the stem): what a cleaner may take for a crashed write's leftover."""
    return f".{Path(name).stem}.partial"


@contextmanager
def written_atomically(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` (same folder, so the rename is atomic; same
    suffix, so writers that pick a format from the name still do) to write the
    output to; renamed over `path` when the block finishes. On any exception
    (Ctrl-C included) the temporary file is removed and an existing file at
    `path` is left exactly as it was. A handle opened on the temporary file stays
    valid after the rename (it then names `path`)."""
    path = Path(path)
    temporary = path.with_name(f"{partial_prefix(path.name)}{os.getpid()}{path.suffix}")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
