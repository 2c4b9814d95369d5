"""Where and how a run's report is printed: the format, `--statistics`, `--quiet`, `--output-file`.

`--quiet` keeps the findings and drops everything else a run would say (the summary, "Fixed N
errors.", notes); errors still go to stderr. `--output-file` writes the report to a file (never
in colour) instead of stdout, as ruff's `--output-file` does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from linter import output
from linter.types import Diagnostic


class OutputError(Exception):
    """The report cannot be written (a usage error: exit 2)."""


@dataclass(frozen=True)
class Printer:
    output_format: str = "full"
    statistics: bool = False
    quiet: bool = False
    output_file: Path | None = None

    def context(
        self,
        unsafe_fixes: bool,
        diagnostics: list[Diagnostic],
        unchecked: int = 0,
        texts: Mapping[str, str] | None = None,
        stream=None,
    ) -> output.Context:
        """The reporters' context; `texts` are linted texts not on disk (stdin), by path."""
        stream = stream or sys.stdout
        colour = self.output_file is None and stream.isatty() and not os.environ.get("NO_COLOR")
        sources, notebooks = linted_texts(diagnostics, texts or {})
        return output.Context(unsafe_fixes, colour, unchecked, sources, notebooks, self.quiet)

    def render(self, diagnostics: list[Diagnostic], context: output.Context) -> str:
        if self.statistics:
            from linter.output import statistics as stats

            as_json = self.output_format == "json"
            text = stats.render(diagnostics, context, as_json=as_json)
            return text if as_json else text + self._summary(diagnostics, context)
        text = output.render(self.output_format, diagnostics, context)
        if self.output_format == "concise":
            text += self._summary(diagnostics, context)
        return text

    def _summary(self, diagnostics: list[Diagnostic], context: output.Context) -> str:
        return "" if self.quiet else output.summary(diagnostics, context) + "\n"

    def report(self, diagnostics: list[Diagnostic], context: output.Context, stream=None) -> None:
        """Print the report to `--output-file`, else to `stream` (stdout by default)."""
        text = self.render(diagnostics, context)
        if self.output_file is None:
            (stream or sys.stdout).write(text)
            return
        try:
            self.output_file.parent.mkdir(parents=True, exist_ok=True)
            self.output_file.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise OutputError(f"cannot write {self.output_file}: {exc.strerror or exc}") from None

    def say(self, message: str) -> None:
        """A line for the user on stderr (a count, a note): not under `--quiet`."""
        if not self.quiet:
            print(message, file=sys.stderr)


def linted_texts(diagnostics: list[Diagnostic], texts: Mapping[str, str]):
    """The linted text of each path the reporters cannot read from disk as it was linted
    (stdin; a notebook's program) and each notebook's cell index, by shown path."""
    sources = dict(texts)
    notebooks = {}
    for path in sorted({d.path for d in diagnostics if d.path.endswith(".ipynb")}):
        from linter.notebooks import index_of
        from linter.source import SourceError, read_bytes

        try:
            text = sources[path] if path in sources else read_bytes(path).decode("utf-8")
        except (SourceError, UnicodeDecodeError):
            continue
        found = index_of(text)
        if found is not None:
            notebooks[path], sources[path] = found
    return sources, notebooks
