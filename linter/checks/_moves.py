"""Edits that move a one-line statement to another block (ACL303, ACL304, ACL305).

A statement moves as its whole physical line, trailing comment included, re-indented to the
line it goes after. Only a statement alone on its own line moves, never the last statement of
its block (the block would be left empty), and never out of a `try`/`except`/`finally` or
`match` block (which exceptions it is under would change). Statements moved together must be
consecutive statements of one block, so no sibling clause (`else:`, `except:`) or other
statement is taken along.
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
    found = block_of(stmt.scope.node, line)
    if found is None or len(found[1]) < 2 or isinstance(found[0], _GUARDED):
        return False
    owner, body = found
    loop_else = isinstance(owner, (cst.For, cst.While)) and owner.orelse is not None
    return not (loop_else and body is owner.orelse.body.body)  # runs only when no `break`


# blocks whose statements run under an exception handler or a pattern: moving out changes that
_GUARDED = (cst.Try, cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)
_GUARDED += (cst.MatchCase,)


def block_of(root: cst.CSTNode, target: cst.CSTNode):
    """(owner, statements) of the block that directly holds the statement `target`: a body, a
    branch, a handler, `else:` or `finally:`, found by identity under `root` (a function or the
    module). The owner of an `else:` block is the statement the `else:` belongs to, as for its
    body. None if not found."""
    stack = [(root, root)]
    while stack:
        node, owner = stack.pop()
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            if any(s is target for s in node.body):
                return owner, node.body
        for child in node.children:
            if isinstance(child, (cst.BaseExpression, cst.SimpleStatementLine)):
                continue
            if isinstance(child, (cst.FunctionDef, cst.ClassDef)) and child is not target:
                continue  # a nested definition: its statements are another scope's
            if isinstance(child, cst.IndentedBlock):
                stack.append((child, owner if isinstance(node, cst.Else) else node))
            else:
                stack.append((child, node if isinstance(child, cst.Else) else child))
    return None


def consecutive(root: cst.CSTNode, lines: list[cst.CSTNode]) -> bool:
    """Whether `lines` are one block's statements, one after another with none between."""
    found = block_of(root, lines[0])
    if found is None:
        return False
    body = list(found[1])
    start = next(i for i, s in enumerate(body) if s is lines[0])
    chunk = body[start : start + len(lines)]
    return len(chunk) == len(lines) and all(a is b for a, b in zip(chunk, lines, strict=True))


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
    lines = [stmt.line for stmt in stmts]
    if len({id(line) for line in lines}) != len(lines):
        return None
    if not consecutive(stmts[0].scope.node, lines):
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
