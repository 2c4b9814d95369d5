"""Line edits the checks' fixes share: finding the block that holds some statements, moving a
statement to another block, inserting a statement after or before another and deleting one,
putting statements under a `with` or moving them into one, bringing in a standard library name
(its spelling in the module, and the import when it has none), and replacing or removing a
statement (an import) with the comments written inside it kept.

Edits work on whole physical lines of the source (comments kept byte for byte) and refuse
what re-indenting would change: a statement that does not start its line, or a multi-line
string (its value would gain the indentation). `RuleContext` holds the one-node edits (replace,
insert a line before, wrap in an `if`, unwrap a `with`).

A statement moves as its whole physical line, trailing comment included, re-indented to the
line it goes after. Only a statement alone on its own line moves, never the last statement of
its block (the block would be left empty), and never out of a `try`/`except`/`finally` or
`match` block (which exceptions it is under would change). Statements moved together must be
consecutive statements of one block, so no sibling clause (`else:`, `except:`) or other
statement is taken along.
"""

from __future__ import annotations

import io
import sys
import tokenize

import libcst as cst

from linter.model.cst_util import code, dotted, walk
from linter.model.functions import Stmt
from linter.types import Edit, Position

_EMPTY = cst.Module(body=[])


# blocks ---------------------------------------------------------------------------------------
def common_block(container: cst.CSTNode, targets: list) -> tuple[list | None, int, int]:
    """(statements, first index, last index) of the deepest block under `container` holding
    all `targets` (statement lines or compound statements); (None, 0, 0) when they are not
    in one indented block."""
    while True:
        body = container.body
        if not isinstance(body, cst.IndentedBlock):
            return None, 0, 0
        block = list(body.body)
        indices = [index_holding(block, t) for t in targets]
        if any(i is None for i in indices):
            return None, 0, 0
        first, last = min(indices), max(indices)
        node = block[first]
        is_target = any(node is t for t in targets)
        descend = first == last and not is_target and _descendable(node, targets)
        if not descend:
            return block, first, last
        container = node


def index_holding(block: list, target: cst.CSTNode) -> int | None:
    """The index of the statement of `block` that is or holds `target`."""
    for i, statement in enumerate(block):
        if statement is target or any(n is target for n in walk(statement)):
            return i
    return None


def _descendable(node, targets) -> bool:
    """A compound statement whose main body holds all targets (not an `else` branch)."""
    if isinstance(node, (cst.With, cst.For, cst.While)):
        return True
    if isinstance(node, cst.If):
        return all(any(n is t for n in walk(node.body)) for t in targets)
    return False


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


def starts_line(ctx, node: cst.CSTNode) -> bool:
    """Whether nothing but indentation precedes `node` on its first line."""
    return not ctx.lines[ctx.line_of(node) - 1][: ctx.span(node)[0].column].strip()


# moving a statement ---------------------------------------------------------------------------
# blocks whose statements run under an exception handler or a pattern: moving out changes that
_GUARDED = (cst.Try, cst.TryStar, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)
_GUARDED += (cst.MatchCase,)


def movable(ctx, stmt: Stmt) -> bool:
    """A statement alone on one line of its own, not its block's last, under no handler."""
    line = stmt.line
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return False
    start, end = ctx.span(line)
    if start.line != end.line or not starts_line(ctx, line):
        return False
    found = block_of(stmt.scope.node, line)
    if found is None or len(found[1]) < 2 or isinstance(found[0], _GUARDED):
        return False
    owner, body = found
    loop_else = isinstance(owner, (cst.For, cst.While)) and owner.orelse is not None
    return not (loop_else and body is owner.orelse.body.body)  # runs only when no `break`


def delete_line(ctx, stmt: Stmt) -> Edit:
    """Delete the physical line of the one-line statement `stmt`."""
    line = ctx.line_of(stmt.line)
    return Edit(Position(line, 0), Position(line + 1, 0), "")


def copy_line_after(ctx, stmt: Stmt, anchor: Stmt) -> Edit | None:
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
    edit = copy_line_after(ctx, stmt, anchor)
    return [delete_line(ctx, stmt), edit] if edit is not None else None


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
    if not isinstance(anchor.line, cst.SimpleStatementLine) or not starts_line(ctx, anchor.line):
        return None
    at_line = ctx.span(anchor.line)[0].line
    indent = ctx.indentation(at_line)
    texts = [ctx.lines[ctx.line_of(stmt.line) - 1].strip() for stmt in stmts]
    at = Position(at_line, 0)
    inserted = Edit(at, at, "".join(f"{indent}{text}\n" for text in texts))
    return [delete_line(ctx, stmt) for stmt in stmts] + [inserted]


# inserting and deleting a statement -----------------------------------------------------------
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
    return ctx.insert_line_before(stmt.line, content)


def delete_alone(ctx, stmt: Stmt) -> Edit | None:
    """Remove a statement that is alone on its line(s), unless its block would be left empty."""
    line = stmt.line
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    if not starts_line(ctx, line):
        return None
    found = block_of(stmt.scope.node, line)
    if found is None or len(found[1]) < 2:
        return None
    first, last = ctx.span(line)[0].line, ctx.span(line)[1].line
    return Edit(Position(first, 0), Position(last + 1, 0), "")


# with blocks ----------------------------------------------------------------------------------
def rewritable(ctx, first: cst.CSTNode, last: cst.CSTNode) -> bool:
    """Statements that start their own line and hold no multi-line string (re-indenting one
    would change its value)."""
    if not starts_line(ctx, first):
        return False
    for statement in (first, last):
        for node in walk(statement):
            if isinstance(node, (cst.SimpleString, cst.FormattedString)) and "\n" in code(node):
                return False
    return True


def wrap_in_with(ctx, first: cst.CSTNode, last: cst.CSTNode, expr: str) -> Edit | None:
    """Put the statements from `first` to `last` (same block) under `with <expr>:`."""
    if not rewritable(ctx, first, last):
        return None
    start, end = ctx.line_of(first), ctx.span(last)[1].line
    indent = ctx.indentation(start)
    body = indented(ctx, start, end)
    content = f"{indent}with {expr}:\n" + "\n".join(body)
    return Edit(Position(start, 0), Position(end, len(ctx.lines[end - 1])), content)


def move_into_with(ctx, block: list, first: int, with_node: cst.With, expr: str) -> Edit | None:
    """Move the statements from `block[first]` up to `with_node` into its body, with the
    header's context replaced by `expr` (comments on the header line are kept)."""
    if not rewritable(ctx, block[first], with_node) or not isinstance(
        with_node.body, cst.IndentedBlock
    ):
        return None
    start, header = ctx.line_of(block[first]), ctx.line_of(with_node)
    body_first = ctx.line_of(with_node.body.body[0]) - len(with_node.body.body[0].leading_lines)
    item_start, item_end = ctx.span(with_node.items[0].item)
    if body_first != header + 1 or item_start.line != header or item_end.line != header:
        return None  # a header spanning several lines
    indent = ctx.indentation(start)
    if ctx.indentation(header) != indent or ctx.indentation(body_first) != indent + ctx.indent_unit:
        return None
    text = ctx.lines[header - 1]
    new_header = text[: item_start.column] + expr + text[item_end.column :]
    end = ctx.span(with_node)[1].line
    moved = indented(ctx, start, header - 1)
    lines = [new_header, *moved, *ctx.lines[body_first - 1 : end]]
    return Edit(Position(start, 0), Position(end, len(ctx.lines[end - 1])), "\n".join(lines))


def indented(ctx, start: int, end: int) -> list[str]:
    """Lines `start`..`end` one indentation unit deeper (blank lines as they are)."""
    unit = ctx.indent_unit
    return [(unit + text) if text.strip() else text for text in ctx.lines[start - 1 : end]]


# imports --------------------------------------------------------------------------------------
def stdlib_name(ctx, module: str, name: str) -> tuple[str, Edit | None]:
    """How this module spells the standard library's `module.name` (`nullcontext`,
    `contextlib.nullcontext`), and the import edit that brings it in when nothing binds it."""
    aliases = ctx.model.imports.aliases
    for local, full in aliases.items():
        if full == f"{module}.{name}":
            return local, None
    for local, full in aliases.items():
        if full == module:
            return f"{local}.{name}", None
    return name, _stdlib_import(ctx, f"from {module} import {name}\n")


def _stdlib_import(ctx, line_text: str) -> Edit:
    """`line_text` after the module's last top-level standard-library import (where isort
    puts it), else above its first import."""
    imports = [
        statement
        for statement in ctx.model.module.body
        if isinstance(statement, cst.SimpleStatementLine)
        and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body)
    ]
    stdlib = [s for s in imports if _stdlib(s.body[0])]
    future = [s for s in imports if _module_of(s.body[0]) == "__future__"]
    if stdlib or future:
        line = ctx.span((stdlib or future)[-1])[1].line + 1
    elif imports:
        line = ctx.line_of(imports[0])
    else:
        line = 1
    return Edit(Position(line, 0), Position(line, 0), line_text)


def _module_of(node) -> str:
    if isinstance(node, cst.Import):
        return dotted(node.names[0].name) or ""
    return "" if node.relative or node.module is None else dotted(node.module) or ""


def _stdlib(node) -> bool:
    name = _module_of(node)
    return name.split(".", 1)[0] in sys.stdlib_module_names and name != "__future__"


def without_names(statement: cst.ImportFrom, dropped: set[int]) -> cst.ImportFrom | None:
    """`from m import ...` without the aliases whose ids are `dropped` (None when none is
    left), commas tidied."""
    remaining = [a for a in statement.names if id(a) not in dropped]
    if not remaining:
        return None
    if id(statement.names[-1]) in dropped:
        remaining[-1] = remaining[-1].with_changes(comma=statement.names[-1].comma)
    if len(remaining) == 1 and not statement.lpar:
        remaining[0] = remaining[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return statement.with_changes(names=remaining, semicolon=cst.MaybeSentinel.DEFAULT)


# statements -----------------------------------------------------------------------------------
def statement_before(ctx, statement: cst.BaseSmallStatement, line, text: str) -> str:
    """`text` as a statement ahead of `statement` (held by the statement line `line`): its own
    line when the line holds nothing else, else joined with `;`."""
    if _owns_line(line):
        return f"{text}\n{ctx.indentation(ctx.line_of(statement))}"
    return f"{text}; "


def _owns_line(line) -> bool:
    return len(line.body) == 1 and isinstance(line, cst.SimpleStatementLine)


def replace_statement(ctx, statement: cst.BaseSmallStatement, line, text: str) -> Edit:
    """Replace the statement, keeping the comments written inside it (a multi-line import's
    `GradScaler,  # for fp16`) as lines above it."""
    old = comments(ctx.text(statement))
    new = comments(text)
    lost = [c for c in old if c not in new]
    if lost and _owns_line(line):
        indent = ctx.indentation(ctx.line_of(statement))
        text = "".join(f"{c}\n{indent}" for c in lost) + text
    return ctx.replace(statement, text)


def remove_statement(ctx, statement: cst.BaseSmallStatement, line, alone_in_block: bool) -> Edit:
    """Delete the statement: its whole line(s) when it is alone there, keeping its comments;
    `pass` in its place when it is the only statement of its block."""
    if len(line.body) > 1:
        others = [s for s in line.body if s is not statement]
        others[-1] = others[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        start, end = ctx.span(line.body[0])[0], ctx.span(line.body[-1])[1]
        return Edit(start, end, "".join(_EMPTY.code_for_node(s) for s in others))
    if alone_in_block or isinstance(line, cst.SimpleStatementSuite):
        return replace_statement(ctx, statement, line, "pass")
    start, end = ctx.span(statement)
    indent = ctx.indentation(start.line)
    trailing = ctx.lines[end.line - 1][end.column :].strip()
    kept = comments(ctx.text(statement))
    kept += [trailing] if trailing.startswith("#") else []
    keep = "".join(f"{indent}{c}\n" for c in kept)
    if end.line >= len(ctx.lines):  # the last line, without a newline after it
        last = Position(end.line, len(ctx.lines[-1]))
        return Edit(Position(start.line, 0), last, keep.rstrip("\n"))
    return Edit(Position(start.line, 0), Position(end.line + 1, 0), keep)


def comments(text: str) -> list[str]:
    """The `#` comments in a piece of code (not the `#` inside its strings)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [t.string for t in tokens if t.type == tokenize.COMMENT]


def merged(edits: list[Edit]) -> list[Edit]:
    """Join an insertion with an edit starting at the same point (`autocast(GradScaler())`
    inserts before the inner callee it also renames): the fixer refuses edits sharing a start."""
    joined: list[Edit] = []
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        last = joined[-1] if joined else None
        if last == edit:
            continue
        if last is not None and last.start == last.end == edit.start:
            joined[-1] = Edit(edit.start, edit.end, last.content + edit.content)
        else:
            joined.append(edit)
    return joined
