"""Where a project starts: the nearest `pyproject.toml`, `setup.cfg` or `.git` above a path
(ruff's and pyright's markers), else the directory given, else the common directory of the
loose files given."""

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


def find_roots(paths: list[Path]) -> dict[Path, Path | None]:
    """Each path's project (absolute path -> root; None: linted alone).

    Every path is placed on its own, as ruff and pyright place each file under its nearest
    configuration: two unrelated trees linted together stay two projects, and their common
    parent (a home directory, `/work`) is never walked. Without a marker, a directory given is
    its own project, and the loose files given share their common directory; a single loose
    file outside any project is linted alone."""
    absolute = [Path(os.path.abspath(p)) for p in paths] or [Path.cwd()]
    roots: dict[Path, Path | None] = {}
    loose: list[Path] = []
    for path in absolute:
        marked = marked_root(path)
        if marked is not None:
            roots[path] = marked
        elif path.is_dir():
            roots[path] = path
        else:
            loose.append(path)
    shared = None
    if len(loose) > 1:
        shared = Path(os.path.commonpath([str(p.parent) for p in loose]))
    for path in loose:
        roots[path] = shared
    return roots


def find_root(paths: list[Path]) -> Path | None:
    """The project of the first path given (see `find_roots`)."""
    absolute = [Path(os.path.abspath(p)) for p in paths] or [Path.cwd()]
    return find_roots(absolute)[absolute[0]]
