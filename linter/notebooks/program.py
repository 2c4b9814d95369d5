"""A notebook's code cells as one Python program, and the way back from program lines to cells.

Cells run in one namespace, so a loop in cell 5 may use the scaler made in cell 2: the analysis sees
all code cells of the notebook, in order, as one module. Each cell is preceded by a marker comment
line, which keeps the cells apart through the fixer's rounds (a fix never crosses a cell; if a
marker were lost the fix is refused), and `CellIndex` maps every program line to its cell and row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from linter.notebooks.magics import Masks, mask_cell
from linter.notebooks.reader import Cell, Notebook
from linter.types import Diagnostic, Edit, Fix, Position

_MARKER = "# accel-lint: notebook cell {number}"
_LINE_MENTION = re.compile(r"\bline (\d+)\b")
_MARKER_LINE = re.compile(r"^# accel-lint: notebook cell (\d+)\n", re.MULTILINE)


@dataclass(frozen=True)
class CellIndex:
    """Program row -> (cell number, row in the cell); the cells' lines as the user wrote them."""

    rows: tuple[tuple[int, int] | None, ...]  # index 0 is program row 1; None for a marker
    lines: dict[int, list[str]]  # cell number -> its original lines

    def locate(self, position: Position) -> tuple[int | None, Position]:
        """The cell and in-cell position of a program position (a marker row: the end of the
        cell before it, which is where an edit or a range that runs to the next line ends)."""
        row, column = position.line, position.column
        if row > len(self.rows) or (row > 1 and self.rows[row - 1] is None):
            row, column = min(row - 1, len(self.rows)), -1
        if row < 1 or self.rows[row - 1] is None:
            return None, position
        cell, in_cell = self.rows[row - 1]
        if column < 0:
            column = len(self.lines[cell][in_cell - 1])
        return cell, Position(in_cell, column)

    def in_cell(self, diagnostic: Diagnostic) -> tuple[int | None, Diagnostic]:
        """The diagnostic's cell, and the diagnostic with its positions (and its fix's) in it."""
        cell, start = self.locate(diagnostic.start)
        if cell is None:
            return None, diagnostic
        end_cell, end = self.locate(diagnostic.end)
        if end_cell != cell:
            last = len(self.lines[cell])
            end = Position(last, len(self.lines[cell][last - 1]))
        fix = diagnostic.fix
        if fix is not None:
            fix = Fix(fix.applicability, fix.message, tuple(self._edit(e) for e in fix.edits))
        message = self._mentions(diagnostic.message)
        notes = tuple(self._mentions(note) for note in diagnostic.notes)
        return cell, replace(
            diagnostic, message=message, start=start, end=end, fix=fix, notes=notes
        )

    def _mentions(self, text: str) -> str:
        """`line 23` of the program, as a user of the notebook finds it: `cell 5, line 6`."""

        def in_cell(match: re.Match) -> str:
            cell, position = self.locate(Position(int(match.group(1)), 0))
            return f"cell {cell}, line {position.line}" if cell is not None else match.group()

        return _LINE_MENTION.sub(in_cell, text)

    def _edit(self, edit: Edit) -> Edit:
        return Edit(self.locate(edit.start)[1], self.locate(edit.end)[1], edit.content)


@dataclass
class Program:
    notebook: Notebook
    text: str
    cells: list[Cell]  # the cells in the program, in order
    masks: Masks
    newline_added: set[int]  # cells whose source did not end with a newline
    index: CellIndex
    ipython: dict[int, set[int]]  # cell number -> the keys of its IPython placeholders

    def cell_sources(self, fixed: str) -> dict[int, str] | None:
        """Each cell's new source from a fixed program (the cells that changed only); None when
        the fixes crossed a cell boundary or moved an IPython line out of recognition."""
        parts = _MARKER_LINE.split(fixed)
        numbers = [int(n) for n in parts[1::2]]
        if parts[0] or numbers != [cell.number for cell in self.cells]:
            return None
        changed: dict[int, str] = {}
        for cell, body in zip(self.cells, parts[2::2], strict=True):
            if cell.number in self.newline_added:
                if not body.endswith("\n"):
                    return None
                body = body[:-1]
            source = self.masks.restore(body, self.ipython[cell.number])
            if source is None:
                return None
            if source != cell.source:
                changed[cell.number] = source
        return changed


def build(notebook: Notebook) -> Program:
    """The program of a notebook's Python code cells (none when it is not a Python notebook)."""
    masks = Masks()
    pieces: list[str] = []
    rows: list[tuple[int, int] | None] = []
    cells: list[Cell] = []
    newline_added: set[int] = set()
    lines: dict[int, list[str]] = {}
    ipython: dict[int, set[int]] = {}
    python = notebook.language in (None, "python")
    for cell in notebook.code_cells if python else ():
        masked = mask_cell(cell.source, masks)
        if masked is None:
            continue
        if not masked.endswith("\n"):
            masked += "\n"
            newline_added.add(cell.number)
        cells.append(cell)
        lines[cell.number] = cell.source.split("\n")
        ipython[cell.number] = masks.keys_in(masked)
        pieces.append(_MARKER.format(number=cell.number) + "\n" + masked)
        rows.append(None)
        rows += [(cell.number, row) for row in range(1, masked.count("\n") + 1)]
    index = CellIndex(tuple(rows), lines)
    return Program(notebook, "".join(pieces), cells, masks, newline_added, index, ipython)
