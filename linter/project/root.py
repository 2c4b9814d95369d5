"""Where a project starts: the nearest `pyproject.toml`, `setup.cfg` or `.git` above a path
(ruff's and pyright's markers), else the common directory of the paths given."""

from __future__ import annotations

import os
from pathlib import Path

MARKERS = ("pyproject.toml", "setup.cfg", ".git")


def marked_root(path: Path) -> Path | None:
    """The nearest directory at or above `path` holding a marker."""
    start = path if path.is_dir() else path.parent
    for directory in (start, *start.parents):
        if any((directory / marker).exists() for marker in MARKERS):
            return directory
    return None


def find_root(paths: list[Path]) -> Path | None:
    """The project of the paths given: the marked root of the first, else their common
    directory. A single file with no marker above it is no project: it is linted alone."""
    absolute = [Path(os.path.abspath(p)) for p in paths] or [Path.cwd()]
    marked = marked_root(absolute[0])
    if marked is not None:
        return marked
    if len(absolute) == 1 and not absolute[0].is_dir():
        return None
    dirs = [p if p.is_dir() else p.parent for p in absolute]
    return Path(os.path.commonpath([str(d) for d in dirs]))
