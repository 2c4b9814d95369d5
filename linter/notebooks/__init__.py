"""Jupyter notebooks: lint the code cells as one program, fix only the cells that change.

Diagnostics keep positions in the program (so the fixer and the cache work as for a `.py` file);
reporters translate them to `cell N:row:col` with the notebook's `CellIndex` (`index_of`), as ruff
does. A notebook that cannot be read as one gets a single ACL000 with the reason.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from linter.notebooks.program import CellIndex, Program, build
from linter.notebooks.reader import NotebookError, parse, replace_sources
from linter.selection import PARSE_ERROR
from linter.types import Diagnostic, Position

if TYPE_CHECKING:
    from linter.checking import FixChoice, TextResult

__all__ = [
    "CellIndex",
    "NotebookError",
    "cell_diff",
    "index_of",
    "lint_notebook_text",
    "notebook_error",
    "program_of",
]
_BOM = "\ufeff"


def program_of(text: str) -> Program:
    """The program of a notebook's JSON text; raises NotebookError."""
    return build(parse(text.removeprefix(_BOM)))


def index_of(text: str) -> tuple[CellIndex, str] | None:
    """The cell index and program text of a notebook (None when it cannot be read)."""
    try:
        program = program_of(text)
    except NotebookError:
        return None
    return program.index, program.text


def notebook_error(shown: str, error: NotebookError) -> Diagnostic:
    at = Position(error.line, error.column)
    return Diagnostic(PARSE_ERROR, f"cannot read notebook: {error}", shown, at, at)


def lint_notebook_text(
    text: str, shown: str, codes: Collection[str], fix: FixChoice = "none", hints: bool = False
) -> TextResult:
    """Lint a notebook's JSON; with `fix`, `fixed` is the notebook's new JSON text."""
    from linter.checking import TextResult, check_source, screen_text

    unchanged = text if fix != "none" else None
    try:
        program = program_of(text)
    except NotebookError as error:
        return TextResult([notebook_error(shown, error)], unchanged)
    # a generated cell can be as deep as a generated module: the module screen, on the program
    checked = screen_text(program.text, shown, fix) or check_source(
        program.text, shown, codes, fix, hints=hints
    )
    checked.cells = program.index
    if fix == "none" or checked.fixed == program.text:
        checked.fixed = unchanged
        return checked
    sources = program.cell_sources(checked.fixed)
    if sources is None:
        kept = check_source(program.text, shown, codes, hints=hints)
        kept.fixed, kept.cells = text, program.index
        kept.error = "a fix would cross a notebook cell or move an IPython line; not applied"
        return kept
    new_text = _BOM * text.startswith(_BOM) + replace_sources(program.notebook, sources)
    checked.fixed = new_text
    checked.cells = program_of(new_text).index
    return checked


def cell_diff(shown: str, before: str, after: str) -> str:
    """A unified diff per changed cell, headed `path:cell N` as ruff's `--diff` shows it."""
    from linter.reporting import unified_diff

    old, new = program_of(before), program_of(after)
    new_sources = {cell.number: cell.source for cell in new.cells}
    parts = []
    for cell in old.cells:
        source = new_sources.get(cell.number, cell.source)
        if source != cell.source:
            parts.append(unified_diff(f"{shown}:cell {cell.number}", cell.source, source))
    return "".join(parts)
