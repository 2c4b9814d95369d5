"""`--output-format github`: GitHub Actions workflow commands that annotate the pull request."""

from __future__ import annotations

import os

from linter.output import Context, column
from linter.types import Diagnostic


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def line(diagnostic: Diagnostic) -> str:
    start, end = diagnostic.start, diagnostic.end
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
    return f"::error {properties}::{_data(f'{diagnostic.code} {diagnostic.message}')}"


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    return "".join(line(d) + "\n" for d in diagnostics)
