"""ACL505: a clip handed a parameter iterator that something already consumed."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model.cst_util import code
from linter.model.setup_facts import exhausted_clips
from linter.types import Edit, Position


def check(ctx: RuleContext) -> None:
    """Report clips whose one-shot parameter iterable is empty by the time they run."""
    for found in exhausted_clips(ctx.model):
        name = code(found.argument)
        fix = make_fix(f"Materialise `{name}` as a list", _as_list(ctx, found.binding.value))
        ctx.report(
            found.clip,
            f"`{name}` is a one-shot iterator already consumed by {found.consumer}: this clip "
            f"receives nothing and clips no gradient (bind `{name}` to a list)",
            fix,
        )


def _as_list(ctx, value: cst.BaseExpression):
    """`list(filter(...))`, or `[p for p in ...]` for a generator expression."""
    text = ctx.text(value)
    if isinstance(value, cst.GeneratorExp):
        brackets = _parentheses_around(ctx, value)
        if brackets is not None:
            return Edit(*brackets, f"[{text}]")
    return ctx.replace(value, f"list({text})")


def _parentheses_around(ctx, node):
    """The span of the parentheses around an expression, which its own range leaves out."""
    start, end = ctx.span(node)
    before = ctx.lines[start.line - 1][: start.column]
    after = ctx.lines[end.line - 1][end.column :]
    if not before.rstrip().endswith("(") or not after.lstrip().startswith(")"):
        return None
    opening = Position(start.line, len(before.rstrip()) - 1)
    closing = Position(end.line, end.column + (len(after) - len(after.lstrip())) + 1)
    return opening, closing
