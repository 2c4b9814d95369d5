"""Reporters, one module per `--output-format`; each exposes `render(diagnostics, context) -> str`.

Positions in `Diagnostic` are 1-based lines and 0-based columns; every reporter prints ruff's
1-based columns. A notebook's diagnostics hold positions in its program (all code cells in one);
`placed` gives the cell and the in-cell positions every reporter shows. Modules are imported on
demand so a run only loads the format it prints.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from linter.types import Diagnostic

if TYPE_CHECKING:
    from linter.notebooks import CellIndex

FORMATS = ("full", "concise", "json", "github", "sarif")
_MODULES = {"json": "json_format"}


@dataclass(frozen=True)
class Context:
    unsafe_fixes: bool = False  # whether unsafe fixes count as available
    colour: bool = False
    unchecked: int = 0  # files the run could not check (internal errors): never "all passed"
    # By shown path: the text that was linted when it is not the file on disk (stdin, notebooks),
    # and each notebook's cell index.
    sources: Mapping[str, str] = field(default_factory=dict)
    notebooks: Mapping[str, CellIndex] = field(default_factory=dict)
    quiet: bool = False  # `--quiet`: the findings only, no summary


def placed(diagnostic: Diagnostic, context: Context) -> tuple[int | None, Diagnostic]:
    """The notebook cell of a diagnostic (None in a module), and the diagnostic as it shows it."""
    index = context.notebooks.get(diagnostic.path)
    return index.in_cell(diagnostic) if index is not None else (None, diagnostic)


def where(diagnostic: Diagnostic, context: Context) -> str:
    """`path:row:col`, or ruff's `path:cell N:row:col` in a notebook."""
    cell, shown = placed(diagnostic, context)
    start = shown.start
    prefix = f"{diagnostic.path}:cell {cell}" if cell is not None else diagnostic.path
    return f"{prefix}:{start.line}:{column(start)}"


def fixable(diagnostic: Diagnostic, context: Context) -> bool:
    from linter import fixer

    return fixer.applicable(diagnostic, context.unsafe_fixes)


def render(name: str, diagnostics: list[Diagnostic], context: Context) -> str:
    module = importlib.import_module(f"linter.output.{_MODULES.get(name, name)}")
    return module.render(diagnostics, context)


def column(position) -> int:
    """ruff's 1-based column."""
    return position.column + 1


def rule_name(code: str) -> str | None:
    from rules import ALL_RULES

    rule = ALL_RULES.get(code)
    return rule.name if rule else ("syntax-error" if code == "ACL000" else None)


def rule_severity(code: str) -> str:
    from rules import ALL_RULES

    rule = ALL_RULES.get(code)
    return rule.severity if rule else "error"


def summary(diagnostics: list[Diagnostic], context: Context) -> str:
    """The closing lines of the text formats, worded like ruff's."""
    levels = [d.severity or rule_severity(d.code) for d in diagnostics]
    errors, warnings, hints = (levels.count(level) for level in ("error", "warning", "info"))
    if not errors + warnings and not context.unchecked:
        shown = f" ({_counted(hints, 'hint')} above: hints never fail a run)" if hints else ""
        return "All checks passed!" + shown
    found = [_counted(errors, "error")] if errors or not warnings else []
    found += [_counted(warnings, "warning")] if warnings else []
    also = f" (and {_counted(hints, 'hint')})" if hints else ""
    lines = [f"Found {' and '.join(found)}{also}."]
    if context.unchecked:
        files = f"{context.unchecked} file{'s' if context.unchecked != 1 else ''}"
        lines.append(f"{files} could not be checked (see the errors above).")
    available = sum(fixable(d, context) for d in diagnostics)
    hidden = sum(
        d.fix is not None and d.fix.applicability == "unsafe" and not context.unsafe_fixes
        for d in diagnostics
    )
    hint = ""
    if hidden:
        plural = "es" if hidden != 1 else ""
        hint = f" ({hidden} unsafe fix{plural} available with `--fix --unsafe-fixes`)"
    if available:
        lines.append(f"[*] {available} fixable with `--fix`{hint}.")
    elif hidden:
        lines.append(f"No fixes available{hint}.")
    return "\n".join(lines)


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"
