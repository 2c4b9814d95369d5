"""What a rule's `check(ctx)` receives: the model, the source, and ways to report and fix.

Edits are computed on exact source ranges taken from the CST, so everything outside the edited
range (comments, blank lines, formatting) stays byte-for-byte as it was.
"""

from __future__ import annotations

from dataclasses import replace

import libcst as cst

from linter.model import Model
from linter.model.cst_util import walk
from linter.types import Configuration, Diagnostic, Edit, Fix, Position, latent_severity


class RuleContext:
    def __init__(self, model: Model, source: str, path: str, code: str) -> None:
        self.model = model
        self.source = source
        self.path = path
        self.code = code
        self.lines = model.lines() if source is model.source else source.split("\n")
        self.diagnostics: list[Diagnostic] = []

    # reporting ----------------------------------------------------------------------
    def report(
        self,
        node: cst.CSTNode | tuple[Position, Position],
        message: str,
        fix: Fix | None = None,
        notes: tuple[str, ...] = (),
        severity: str | None = None,
        configuration: Configuration | None = None,
    ) -> Diagnostic:
        """Record a finding; `severity="info"` marks a hint of a rule that otherwise errs.
        `configuration`: the runs it affects; one harmless by default is reported a level
        lower (`latent_severity`)."""
        start, end = node if isinstance(node, tuple) else self.span(node)
        if fix is not None and fix.applicability is None:
            fix = replace(fix, applicability=record_applicability(self.code))
        if fix is not None and self.model.instance_calls and self._edits_a_called_class(start, fix):
            fix = None
        severity = latent_severity(configuration, severity)
        diagnostic = Diagnostic(
            self.code, message, self.path, start, end, fix, notes, severity, configuration
        )
        self.diagnostics.append(diagnostic)
        return diagnostic

    def _edits_a_called_class(self, start: Position, fix: Fix) -> bool:
        from linter.model.classes import edits_a_called_class

        lines = [line for e in fix.edits for line in (e.start.line, e.end.line)]
        return edits_a_called_class(self.model, start.line, lines)

    def span(self, node: cst.CSTNode) -> tuple[Position, Position]:
        found = self.model.positions.range(node)
        start = Position(found.start.line, found.start.column)
        return start, Position(found.end.line, found.end.column)

    def text(self, node: cst.CSTNode) -> str:
        """The exact source text of a node."""
        start, end = self.span(node)
        if start.line == end.line:
            return self.lines[start.line - 1][start.column : end.column]
        parts = [self.lines[start.line - 1][start.column :]]
        parts.extend(self.lines[start.line : end.line - 1])
        parts.append(self.lines[end.line - 1][: end.column])
        return "\n".join(parts)

    def line_of(self, node: cst.CSTNode) -> int:
        return self.span(node)[0].line

    # edits ----------------------------------------------------------------------------
    @property
    def indent_unit(self) -> str:
        return self.model.module.default_indent

    def indentation(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[: len(text) - len(text.lstrip())]

    def replace(self, node: cst.CSTNode, content: str) -> Edit:
        start, end = self.span(node)
        return Edit(start, end, content)

    def insert_line_before(self, line_node: cst.CSTNode, content: str) -> Edit | None:
        """Insert `content` as its own line above a statement line, at its indentation."""
        if not isinstance(line_node, cst.SimpleStatementLine):
            return None
        line = self.line_of(line_node)
        indent = self.indentation(line)
        return Edit(Position(line, 0), Position(line, 0), f"{indent}{content}\n")

    def _full_lines(self, node: cst.CSTNode) -> tuple[int, int]:
        start, end = self.span(node)
        return start.line, end.line

    def wrap_in_if(self, line_nodes: list[cst.CSTNode], condition: str) -> Edit | None:
        """Put whole statement lines (comments included) under one `if condition:`: lines of one
        statement each, or whole `if` statements with all their branches. The nodes must be
        consecutive statements of one block: the edit spans the lines from the first to the
        last, so a sibling clause (`else:`, `except:`) or another statement between them would
        be nested under the new `if` too, and a multi-line string would gain indentation."""
        for node in line_nodes:
            simple = isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1
            if not (simple or isinstance(node, cst.If)) or not self._starts_line(node):
                return None
            if any(_multiline_string(self, n) for n in walk(node)):
                return None
        first = self._full_lines(line_nodes[0])[0]
        last = self._full_lines(line_nodes[-1])[1]
        if not self._only_these(line_nodes, first, last):
            return None
        indent = self.indentation(first)
        body = [
            (self.indent_unit + text) if text.strip() else text
            for text in self.lines[first - 1 : last]
        ]
        content = f"{indent}if {condition}:\n" + "\n".join(body)
        end = Position(last, len(self.lines[last - 1]))
        return Edit(Position(first, 0), end, content)

    def _only_these(self, line_nodes: list[cst.CSTNode], first: int, last: int) -> bool:
        """Whether lines `first`..`last` hold only these statements (one indentation) and
        blank or comment lines: any other line would be a clause or a statement of its own."""
        covered = set()
        for node in line_nodes:
            start, end = self._full_lines(node)
            covered.update(range(start, end + 1))
        indents = {self.indentation(self.line_of(node)) for node in line_nodes}
        if len(indents) != 1:
            return False
        for number in range(first, last + 1):
            text = self.lines[number - 1].strip()
            if number not in covered and text and not text.startswith("#"):
                return False
        return True

    def _starts_line(self, node: cst.CSTNode) -> bool:
        start, _ = self.span(node)
        return self.lines[start.line - 1][: start.column].strip() == ""

    def unwrap_with(self, with_node: cst.With) -> Edit | None:
        """Remove a one-line `with ...:` header and dedent its indented body one level."""
        if not isinstance(with_node.body, cst.IndentedBlock) or not self._starts_line(with_node):
            return None
        first, last = self._full_lines(with_node)
        body_first = self.line_of(with_node.body.body[0])
        body_first -= len(with_node.body.body[0].leading_lines)
        if body_first != first + 1:
            return None  # a header spanning several lines
        outer = self.indentation(first)
        inner = self.indentation(self.line_of(with_node.body.body[0]))
        if not inner.startswith(outer) or inner == outer:
            return None
        prefix = inner[len(outer) :]
        body = []
        for text in self.lines[body_first - 1 : last]:
            if text.strip() and not text.startswith(outer + prefix):
                return None  # e.g. a multi-line string at a lower indentation
            body.append(outer + text[len(outer + prefix) :] if text.strip() else text)
        end = Position(last, len(self.lines[last - 1]))
        return Edit(Position(first, 0), end, "\n".join(body))


def _multiline_string(ctx: RuleContext, node: cst.CSTNode) -> bool:
    if not isinstance(node, (cst.SimpleString, cst.FormattedString)):
        return False
    start, end = ctx.span(node)
    return start.line != end.line


def make_fix(message: str, *edits: Edit | None, applicability: str | None = None) -> Fix | None:
    """A Fix from the edits, or None when any edit could not be made. Without `applicability`
    the fix is as safe as its rule's record says (`Rule.fix`), filled in by `report`."""
    if not edits or any(e is None for e in edits):
        return None
    ordered = tuple(sorted(edits, key=lambda e: (e.start, e.end)))
    return Fix(applicability, message, ordered)


def record_applicability(code: str) -> str:
    """A rule whose record calls its fix unsafe offers only unsafe fixes; every other fixing
    rule ("safe", "safe-when-trailing": it offers the fix only where it is safe) safe ones."""
    from rules import ALL_RULES

    return "unsafe" if ALL_RULES[code].fix == "unsafe" else "safe"
