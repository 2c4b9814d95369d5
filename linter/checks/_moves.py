"""Edits that move a one-line statement to another block (ACL303, ACL304, ACL305).

A statement moves as its whole physical line, trailing comment included, re-indented to the
line it goes after. Only a statement alone on its own line moves, and never the last statement
of its block (the block would be left empty).
"""

from __future__ import annotations

import libcst as cst

from linter.model.functions import Stmt
from linter.types import Edit, Position


def movable(ctx, stmt: Stmt) -> bool:
    line = stmt.line
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return False
    start, end = ctx.span(line)
    if start.line != end.line or ctx.lines[start.line - 1][: start.column].strip():
        return False
    return _block_size(stmt) > 1


def _block_size(stmt: Stmt) -> int:
    """How many statements the block holding `stmt` has."""
    for frame in reversed(stmt.frames):
        if frame.kind == "exit":
            continue
        node = frame.node
        if frame.kind == "if" and not frame.holds:
            node = node.orelse
        body = getattr(node, "body", None)
        return len(body.body) if isinstance(body, cst.IndentedBlock) else 1
    return 2  # the module or function body


def delete(ctx, stmt: Stmt) -> Edit:
    line = ctx.line_of(stmt.line)
    return Edit(Position(line, 0), Position(line + 1, 0), "")


def insert_after(ctx, stmt: Stmt, anchor: Stmt) -> Edit | None:
    """The line of `stmt` placed on a new line after the statement line of `anchor`."""
    if not isinstance(anchor.line, cst.SimpleStatementLine):
        return None
    line = ctx.line_of(stmt.line)
    text = ctx.lines[line - 1].strip()
    end = ctx.span(anchor.line)[1].line
    indent = ctx.indentation(ctx.line_of(anchor.line))
    at = Position(end, len(ctx.lines[end - 1]))  # the end of the anchor's last line
    return Edit(at, at, f"\n{indent}{text}")


def move_after(ctx, stmt: Stmt, anchor: Stmt) -> list[Edit] | None:
    """Delete `stmt`'s line and insert it after `anchor`, or None when it cannot move."""
    if not movable(ctx, stmt):
        return None
    edit = insert_after(ctx, stmt, anchor)
    return [delete(ctx, stmt), edit] if edit is not None else None


def move_before(ctx, stmts: list[Stmt], anchor: Stmt) -> list[Edit] | None:
    """Delete the lines of `stmts` and insert them, in order, just before `anchor`'s line, at
    its indentation; None when one of them cannot move."""
    if not all(movable(ctx, stmt) for stmt in stmts):
        return None
    if not isinstance(anchor.line, cst.SimpleStatementLine) or not _alone(ctx, anchor):
        return None
    at_line = ctx.span(anchor.line)[0].line
    indent = ctx.indentation(at_line)
    texts = [ctx.lines[ctx.line_of(stmt.line) - 1].strip() for stmt in stmts]
    at = Position(at_line, 0)
    inserted = Edit(at, at, "".join(f"{indent}{text}\n" for text in texts))
    return [delete(ctx, stmt) for stmt in stmts] + [inserted]


def _alone(ctx, stmt: Stmt) -> bool:
    start, _ = ctx.span(stmt.line)
    return not ctx.lines[start.line - 1][: start.column].strip()
