"""The linter's values in LSP terms: ranges, severities, diagnostics and text edits.

The linter counts lines from 1 and columns in characters; LSP counts lines from 0 and columns in
the code units the client negotiated (UTF-16 unless it offered another), so every position goes
through pygls's codec with the document's lines split where Python splits them.
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types

from linter.types import Diagnostic, Edit, Position

SOURCE = "accel-lint"
SEVERITIES = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "info": types.DiagnosticSeverity.Information,
}


class Lines:
    """A document's lines, and its positions converted to the client's code units."""

    def __init__(self, text: str, codec):
        from linter.source import split_lines

        self.lines = split_lines(text)
        self.codec = codec

    def position(self, at: Position) -> types.Position:
        line = min(max(at.line - 1, 0), len(self.lines) - 1)
        character = min(at.column, len(self.lines[line]))
        return self.codec.position_to_client_units(
            self.lines, types.Position(line=line, character=character)
        )

    def range(self, start: Position, end: Position) -> types.Range:
        return types.Range(start=self.position(start), end=self.position(end))

    def linter_position(self, at: types.Position) -> Position:
        """A client position as the linter counts it (1-based line, column in characters)."""
        if not self.lines:
            return Position(1, 0)
        line = min(at.line, len(self.lines) - 1)
        point = types.Position(line=line, character=at.character)
        converted = self.codec.position_from_client_units(self.lines, point)
        return Position(line + 1, converted.character)

    def end(self) -> Position:
        """The position after the last character of the document."""
        return Position(len(self.lines), len(self.lines[-1]))


def severity(diagnostic: Diagnostic) -> types.DiagnosticSeverity:
    """The finding's own severity (an "info" hint of an error rule), else its rule's."""
    from rules import ALL_RULES

    rule = ALL_RULES.get(diagnostic.code)
    level = diagnostic.severity or (rule.severity if rule else "error")
    return SEVERITIES.get(level, types.DiagnosticSeverity.Error)


def docs_href(code: str) -> str | None:
    from rules import ALL_RULES, module_name

    if code not in ALL_RULES:
        return None  # ACL000: a syntax error has no rule page
    # The rule's own module (its record and --explain text), wherever accel-lint is installed:
    # the project publishes no documentation site.
    import rules

    return (Path(rules.__file__).parent / f"{module_name(code)}.py").as_uri()


def to_lsp(diagnostic: Diagnostic, lines: Lines) -> types.Diagnostic:
    href = docs_href(diagnostic.code)
    config = diagnostic.configuration
    shown = (config.describe(),) if config is not None else ()
    message = "\n".join((diagnostic.message, *diagnostic.notes, *shown))
    return types.Diagnostic(
        range=lines.range(diagnostic.start, diagnostic.end),
        message=message,
        severity=severity(diagnostic),
        code=diagnostic.code,
        code_description=types.CodeDescription(href=href) if href else None,
        source=SOURCE,
        data={"configuration": config.as_dict()} if config is not None else None,
    )


def text_edit(edit: Edit, lines: Lines) -> types.TextEdit:
    return types.TextEdit(range=lines.range(edit.start, edit.end), new_text=edit.content)


def contains(diagnostic: Diagnostic, at: Position) -> bool:
    """Whether a cursor at `at` touches the finding (its end included, as editors do)."""
    return diagnostic.start <= at <= diagnostic.end


def overlaps(diagnostic: Diagnostic, start: Position, end: Position) -> bool:
    return diagnostic.start <= end and start <= diagnostic.end
