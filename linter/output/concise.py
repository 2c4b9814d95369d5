"""`--output-format concise`: one line per diagnostic, `path:line:col: CODE [*] message`."""

from __future__ import annotations

from linter.output import Context, column, fixable
from linter.types import Diagnostic


def line(diagnostic: Diagnostic, context: Context) -> str:
    marker = "[*] " if fixable(diagnostic, context) else ""
    start = diagnostic.start
    return (
        f"{diagnostic.path}:{start.line}:{column(start)}: {diagnostic.code} {marker}"
        f"{diagnostic.message}"
    )


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    return "".join(line(d, context) + "\n" for d in diagnostics)
