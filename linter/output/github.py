"""`--output-format github`: GitHub Actions workflow commands that annotate the pull request.

In a notebook the line is the cell's and the message starts with `cell N:` (ruff's layout).
"""

from __future__ import annotations

import os

from linter.output import Context, column, placed, rule_severity
from linter.types import Diagnostic


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


# GitHub's annotation levels: a hint is a notice, never an error.
_COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def _command(diagnostic: Diagnostic) -> str:
    return _COMMANDS[diagnostic.severity or rule_severity(diagnostic.code)]


def line(diagnostic: Diagnostic, context: Context | None = None) -> str:
    cell, diagnostic = placed(diagnostic, context or Context())
    start, end = diagnostic.start, diagnostic.end
    text = f"{diagnostic.code} {diagnostic.message}"
    if diagnostic.configuration is not None:
        text += f" ({diagnostic.configuration.describe()})"
    properties = ",".join(
        [
            f"title={_property(f'accel-lint ({diagnostic.code})')}",
            f"file={_property(os.path.abspath(diagnostic.path))}",
            f"line={start.line}",
            f"col={column(start)}",
            f"endLine={end.line}",
            f"endColumn={column(end)}",
        ]
    )
    if cell is not None:
        text = f"cell {cell}: {text}"
    return f"::{_command(diagnostic)} {properties}::{_data(text)}"


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    return "".join(line(d, context) + "\n" for d in diagnostics)
