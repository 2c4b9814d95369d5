"""Edits the GradScaler rules (ACL102-ACL104) share: a statement inserted after another, or one
removed, computed on exact source ranges so that comments and formatting stay as they were."""

from __future__ import annotations

import libcst as cst

from linter.model.cst_util import walk
from linter.model.functions import Stmt
from linter.model.kinds import FrameKind
from linter.types import Edit, Position


def insert_after(ctx, stmt: Stmt, content: str) -> Edit:
    """`content` right after the small statement `stmt`: on a line of its own when `stmt` ends
    its line, else as `; content` (`scaler.step(opt); opt.zero_grad()`, `if c: scaler.step(o)`)."""
    line = stmt.line
    last = stmt.index == len(line.body) - 1
    end = ctx.span(line)[1].line
    if isinstance(line, cst.SimpleStatementLine) and last and end < len(ctx.lines):
        indent = ctx.indentation(ctx.line_of(line))
        return Edit(Position(end + 1, 0), Position(end + 1, 0), f"{indent}{content}\n")
    after = ctx.span(stmt.node)[1]
    return Edit(after, after, f"; {content}")


def insert_before(ctx, stmt: Stmt, content: str) -> Edit | None:
    """`content` on its own line above the line of `stmt`, at its indentation."""
    if not isinstance(stmt.line, cst.SimpleStatementLine):
        return None
    return ctx.insert_line_before(stmt.line, content)


def delete(ctx, stmt: Stmt) -> Edit | None:
    """Remove a statement that is alone on its line(s), unless its block would be left empty."""
    line = stmt.line
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    if not ctx.lines[ctx.line_of(line) - 1][: ctx.span(line)[0].column].strip() == "":
        return None
    block = _block_of(stmt)
    if block is None or len(block.body) < 2:
        return None
    first, last = ctx.span(line)[0].line, ctx.span(line)[1].line
    return Edit(Position(first, 0), Position(last + 1, 0), "")


def _block_of(stmt: Stmt) -> cst.IndentedBlock | cst.Module | None:
    enclosing = [
        f.node for f in stmt.frames if f.kind != FrameKind.EXIT
    ]  # an exit `if` is a sibling
    root = enclosing[-1] if enclosing else stmt.scope.node
    for node in walk(root):
        if isinstance(node, (cst.IndentedBlock, cst.Module)):
            if any(item is stmt.line for item in node.body):
                return node
    return None
