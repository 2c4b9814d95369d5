"""ACL202: a backward written inside an enabled autocast region."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model import distributed as dist
from linter.model.cst_util import code, walk
from linter.model.kinds import RegionKind
from linter.model.precision import FP32, innermost_autocast
from linter.model.precision_runs import autocast_configuration
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
    with_node = cast.region.with_node
    why = "the statements after it would leave the region too"
    if len(with_node.items) == 1:
        edit = _dedent_trailing(ctx, site.stmt, with_node)
        advice = "move it after the `with` block"
    else:
        edit = _split_trailing(ctx, site.stmt, cast.region)
        advice = "end the autocast region before it"
        if _last_of(site.stmt, with_node):
            why = "the `with` enters other contexts too, which the backward must stay in"
    if edit is None:
        advice += f"; no automatic fix, since {why}"
    ctx.report(
        site.call,
        f"backward inside the autocast region of line {line}: autocast should cover the forward "
        "only (custom autograd backwards and torch.compile's traced backward see the region's "
        f"autocast state) ({advice})",
        make_fix("Move the backward after the autocast block", edit),
        configuration=autocast_configuration(ctx.model, cast),
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


def _last_of(stmt, with_node: cst.With) -> bool:
    body = with_node.body
    return isinstance(body, cst.IndentedBlock) and len(body.body) > 1 and body.body[-1] is stmt.line


def _split_trailing(ctx: RuleContext, stmt, region) -> Edit | None:
    """`with <others>, autocast():` (autocast last) becomes `with <others>:` holding `with
    autocast():` around all but the trailing backward, which stays in the other contexts.
    Contexts after the autocast item are entered before it then, so they must be sync switches
    (`no_sync`, `accumulate`), whose entering neither reads nor changes the autocast state."""
    with_node, item = region.with_node, region.item
    body = with_node.body
    if with_node.asynchronous is not None or not isinstance(body, cst.IndentedBlock):
        return None
    line = stmt.line
    if len(body.body) < 2 or body.body[-1] is not line or len(line.body) != 1:
        return None
    index = next((i for i, it in enumerate(with_node.items) if it is item), None)
    if index is None:
        return None
    switches = _sync_switch_items(ctx, with_node)
    if any(id(it) not in switches for it in with_node.items[index + 1 :]):
        return None
    header = ctx.line_of(with_node)
    first_body = ctx.line_of(body.body[0]) - len(body.body[0].leading_lines)
    if ctx.span(with_node.items[-1])[1].line != header or first_body != header + 1:
        return None  # a header spanning several lines
    if any(_multiline_string(statement) for statement in body.body[:-1]):
        return None  # re-indenting it would change its value
    outer, unit = ctx.indentation(header), ctx.indent_unit
    if ctx.indentation(first_body) != outer + unit:
        return None
    others = ", ".join(_item_text(it) for it in with_node.items if it is not item)
    comment = body.header.comment
    inner = [
        (unit + text) if text.strip() else text
        for text in ctx.lines[first_body - 1 : ctx.line_of(line) - 1]
    ]
    lines = [
        f"{outer}with {others}:"
        + (body.header.whitespace.value + comment.value if comment else ""),
        f"{outer}{unit}with {_item_text(item)}:",
        *inner,
    ]
    return Edit(Position(header, 0), Position(ctx.line_of(line), 0), "\n".join(lines) + "\n")


def _sync_switch_items(ctx: RuleContext, with_node: cst.With) -> set[int]:
    """ids of the `with`'s items that only switch DDP's gradient sync."""
    found = {
        id(r.item)
        for r in ctx.model.regions
        if r.with_node is with_node and r.kind in (RegionKind.ACCUMULATE, RegionKind.NO_SYNC)
    }
    scope = _scope_of(ctx, with_node)
    if scope is not None:
        found |= {
            id(r.item) for r in dist.no_sync_regions(ctx.model, scope) if r.with_node is with_node
        }
    return found


def _scope_of(ctx: RuleContext, with_node: cst.With):
    for scope in ctx.model.scopes:
        if any(w is with_node for w, _ in scope.withs):
            return scope
    return None


def _item_text(item: cst.WithItem) -> str:
    text = code(item.item)
    return f"{text} as {code(item.asname.name)}" if item.asname is not None else text


def _multiline_string(statement) -> bool:
    return any(
        isinstance(n, (cst.SimpleString, cst.FormattedString)) and "\n" in code(n)
        for n in walk(statement)
    )
