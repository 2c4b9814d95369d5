"""What every front end (runner, stdin, server, notebooks) shows the same way: a path as the user
sees it, a file-level ACL000 (unreadable, unanalysable, a syntax error) and a unified diff.

It sits below `runner`, `text` and `notebooks` and imports none of them, so they share these
without importing each other.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from linter.selection import PARSE_ERROR
from linter.types import Diagnostic, Position


def shown_path(path: Path) -> str:
    """Relative to the working directory when under it (as ruff prints), else as given."""
    absolute = os.path.abspath(path)
    cwd = os.getcwd()
    if absolute.startswith(cwd + os.sep):
        return os.path.relpath(absolute, cwd)
    return str(path)


def syntax_error(text: str, shown: str, failure) -> Diagnostic:
    """ACL000 worded and placed by CPython's own parser when it agrees the file is invalid
    (its messages are clearer than libcst's), else by libcst."""
    try:
        found = _cpython_syntax_error(text, shown)
    except (ValueError, OverflowError):
        found = None  # e.g. a null byte: fall back to libcst's account
    if found is not None:
        return found
    at = Position(failure.line, failure.column)
    return Diagnostic(PARSE_ERROR, f"SyntaxError: {failure.message}", shown, at, at)


def _cpython_syntax_error(source: str | bytes, shown: str) -> Diagnostic | None:
    try:
        compile(source, shown, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as error:
        start = Position(error.lineno or 1, max(0, (error.offset or 1) - 1))
        end = Position(error.end_lineno or start.line, max(0, (error.end_offset or 1) - 1))
        return Diagnostic(PARSE_ERROR, f"SyntaxError: {error.msg}", shown, start, max(start, end))
    return None


def file_error(shown: str, message: str, line: int = 1) -> Diagnostic:
    at = Position(line, 0)
    return Diagnostic(PARSE_ERROR, message, shown, at, at)


def unified_diff(shown: str, before: str, after: str) -> str:
    import difflib

    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), shown, shown
    )
    return "".join(line if line.endswith(("\n", "\r")) else line + "\n" for line in lines)
