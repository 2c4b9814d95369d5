"""The project a linted file belongs to: facts from its other modules.

`root.find_roots` finds each path's project as ruff and pyright do; `resolve.Modules` maps the
file's imports of the project's own modules to files (third-party and stdlib are never
followed);
`summary.summarize` reads a module once (Python's `ast`, cached by content hash) into plain
frozen data; `context.Context` turns the summaries a file needs into a *context*: the text of
the definitions it calls (and of the functions in other modules that call it), appended after
the file so the training-loop model reads them exactly as it reads the file's own functions.
Findings and fixes stay in the file; a message naming a line of the context names the other
module's file and line instead.

The project is switched on for files read from disk (`for_paths`, then `enable`) and by the
language server; stdin and a single file outside any project are analysed alone, as before.
`store.Store` keeps the importer index and the summaries on disk between runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from linter.project.context import Context, Project, Projects

_current: Project | None = None


def enable(project: Project | None) -> None:
    """Set (or clear, with None) the project the next analyses consult."""
    global _current
    _current = project


def current() -> Project | Projects | None:
    return _current


def for_paths(paths, linted, store: Path | None = None) -> Projects | None:
    """The projects of a run over `paths`, each path in its own (None: all linted alone);
    `linted`, the files the run reports on; `store`, the directory kept between runs (None:
    nothing is written, `--no-cache`)."""
    from linter.project.root import find_roots
    from linter.project.store import Store

    roots = sorted({root for root in find_roots(list(paths)).values() if root is not None})
    if not roots:
        return None
    found = Projects(roots, Store(store) if store is not None else None)
    found.linted = frozenset(os.path.abspath(path) for path in linted)
    return found


__all__ = ["Context", "Project", "Projects", "current", "enable", "for_paths"]
