"""Entry point from the driver into the static analysis: parse, build the model, run rules.

The interface (owned here, used by the runner/CLI):
- `analyze_source(source, path, codes) -> list[Diagnostic]` (raises `ParseFailure`)
- `describe_loops(source, path) -> dict` (the JSON form of `--show-loops`)
"""

from __future__ import annotations

from collections.abc import Collection

from linter.types import Diagnostic


class ParseFailure(Exception):
    """The file is not valid Python: reported as ACL000 with a line and column."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


def analyze_source(source: str, path: str, codes: Collection[str]) -> list[Diagnostic]:
    """Run every selected rule that has a static check on one module's source text."""
    raise NotImplementedError("being written: training-loop model and rules")


def describe_loops(source: str, path: str) -> dict:
    """What the linter understood about each training loop (for `--show-loops`)."""
    raise NotImplementedError("being written: training-loop model")
