"""The project a linted file belongs to: facts from its other modules (issue 23).

`root.find_root` finds the project as ruff and pyright do; `resolve.Modules` maps the file's
imports of the project's own modules to files (third-party and stdlib are never followed);
`summary.summarize` reads a module once (Python's `ast`, cached by content hash) into plain
frozen data; `context.Context` turns the summaries a file needs into a *context*: the text of
the definitions it calls (and of the functions in other modules that call it), appended after
the file so the training-loop model reads them exactly as it reads the file's own functions.
Findings and fixes stay in the file; a message naming a line of the context names the other
module's file and line instead.

The project is switched on by the runner for files read from disk (`enable`); stdin, the
language server and a single file outside any project are analysed alone, as before.
"""

from __future__ import annotations

from linter.project.context import Context, Project

_current: Project | None = None


def enable(project: Project | None) -> None:
    """Set (or clear, with None) the project the next analyses consult."""
    global _current
    _current = project


def current() -> Project | None:
    return _current


__all__ = ["Context", "Project", "current", "enable"]
