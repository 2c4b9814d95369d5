"""ACL202: a backward written inside an enabled autocast region."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model.precision import FP32, innermost_autocast
from linter.types import Edit, Position


def check(ctx: RuleContext) -> None:
    """Report backward calls whose nearest enclosing autocast region is enabled and low
    precision (an `enabled=False` island, or `accelerator.autocast()` of an fp32 engine, runs the
    backward in fp32)."""
    seen = set()
    for loop in ctx.model.loops:
        for site in loop.backwards:
            if id(site) in seen:
                continue
            seen.add(id(site))
            cast = innermost_autocast(ctx.model, site.stmt)
            if cast is None or cast.enabled is False or cast.dtype == FP32:
                continue
            _report(ctx, site, cast)


def _report(ctx: RuleContext, site, cast) -> None:
    line = ctx.line_of(cast.region.item.item)
    edit = _dedent_trailing(ctx, site.stmt, cast.region.with_node)
    advice = "move it after the `with` block"
    if edit is None:
        advice += "; no automatic fix, since the statements after it would leave the region too"
    ctx.report(
        site.call,
        f"backward inside the autocast region of line {line}: autocast should cover the forward "
        f"only, and under torch.compile the backward can run in low precision ({advice})",
        make_fix("Move the backward after the autocast block", edit),
    )


def _dedent_trailing(ctx: RuleContext, stmt, with_node: cst.With) -> Edit | None:
    """Re-indent the backward's line to the `with` statement's level when it is the last one
    of the block (and not the only one): then only the backward leaves the region."""
    body = with_node.body
    if not isinstance(body, cst.IndentedBlock) or len(body.body) < 2:
        return None
    line = stmt.line
    if body.body[-1] is not line or len(line.body) != 1:
        return None
    first, last = ctx.span(line)[0].line, ctx.span(line)[1].line
    outer = ctx.indentation(ctx.line_of(with_node))
    inner = ctx.indentation(first)
    if not inner.startswith(outer) or inner == outer:
        return None
    lines = ctx.lines[first - 1 : last]
    if any(text.strip() and not text.startswith(inner) for text in lines):
        return None  # a continuation line indented less than the statement
    content = "\n".join(outer + text[len(inner) :] if text.strip() else text for text in lines)
    return Edit(Position(first, 0), Position(last, len(ctx.lines[last - 1])), content)
