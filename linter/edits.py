"""Line edits the checks' fixes share: finding the block that holds some statements, putting
statements under a `with`, moving statements into a `with` block, bringing in a standard
library name (its spelling in the module, and the import when it has none), and replacing or
removing a statement (an import) with the comments written inside it kept.

Edits work on whole physical lines of the source (comments kept byte for byte) and refuse
what re-indenting would change: a statement that does not start its line, or a multi-line
string (its value would gain the indentation). `RuleContext` holds the one-node edits (replace,
insert a line before, wrap in an `if`, unwrap a `with`); `linter/checks/_moves.py` moves a
statement to another block.
"""

from __future__ import annotations

import io
import sys
import tokenize

import libcst as cst

from linter.model.cst_util import code, dotted, walk
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


# with blocks ----------------------------------------------------------------------------------
def rewritable(ctx, first: cst.CSTNode, last: cst.CSTNode) -> bool:
    """Statements that start their own line and hold no multi-line string (re-indenting one
    would change its value)."""
    if ctx.lines[ctx.line_of(first) - 1][: ctx.span(first)[0].column].strip():
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
