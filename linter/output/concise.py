"""`--output-format concise`: one line per diagnostic, `path:line:col: CODE [*] message`
(`path:cell N:line:col: ...` in a notebook)."""

from __future__ import annotations

from linter.output import Context, fixable, placed, where
from linter.types import Diagnostic


def line(diagnostic: Diagnostic, context: Context) -> str:
    marker = "[*] " if fixable(diagnostic, context) else ""
    shown = placed(diagnostic, context)[1]
    return f"{where(diagnostic, context)}: {diagnostic.code} {marker}{shown.message}"


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    return "".join(line(d, context) + "\n" for d in diagnostics)
