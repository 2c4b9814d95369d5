"""ACL402: a loss divided by the world size on its way to a backward that DDP averages."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model import distributed as dist
from linter.model.cst_util import code, walk
from linter.model.kinds import EngineKind, FrameKind, SiteKind
from linter.types import Edit, Position

_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float)


def check(ctx: RuleContext) -> None:
    model = ctx.model
    if dist.has_comm_hook(model):
        return  # a registered hook decides how gradients combine (a summing one needs 1/W)
    seen: set[int] = set()
    for loop in model.loops:
        for site in loop.backwards:
            loss = model.loss_expr(site)
            scope = site.stmt.scope
            if loss is None or dist.reduces_gradients_by_hand(model, scope):
                continue
            owner = _averaging_model(model, loop, site)
            if owner is None:
                continue
            for division in dist.world_size_divisions(model, loss, site.stmt):
                key = id(division.node if division.node is not None else division.bound)
                if key not in seen:
                    seen.add(key)
                    _report(ctx, loop, site, division, owner)


def _averaging_model(model, loop, site) -> str | None:
    """The DDP-wrapped or prepared model whose backward averages over the ranks, or None for
    a loop without one (manual all-reduce code, where 1/W is required)."""
    scope = site.stmt.scope
    flow = model.flow(site)
    for name in sorted(flow.models if flow is not None else ()):
        if dist.ddp_held_by(model, name, scope) is not None or model.is_prepared(name, scope):
            return name
    found = dist.ddp_models_in(model, loop)
    if found:
        return found[0][0].name
    if site.kind == SiteKind.ENGINE_BACKWARD:
        engine = model.engine_for(site.receiver, scope)
        if engine is not None and engine.kind in (EngineKind.ACCELERATE, EngineKind.GUARD):
            return f"the model prepared by `{engine.name}`"
    return None


def _report(ctx, loop, site, division, owner: str) -> None:
    w = code(division.world_size)
    where = division.node if division.node is not None else division.bound.stmt.node
    fix, note = _fix(ctx, loop, site, division)
    notes = (note,) if note else ()
    subject = owner if owner.startswith("the ") else f"`{owner}`"
    ctx.report(
        where,
        f"the loss is divided by the world size `{w}` on its way to the backward, but DDP "
        f"already averages the gradients of {subject} over the ranks: they end up `{w}` times "
        "too small, so training changes with the number of processes",
        fix,
        notes=notes,
    )


def _fix(ctx, loop, site, division):
    d = division.bound
    if d is not None and not _feeds_only_the_backward(loop, site, d):
        return None, (
            f"`{d.target}` is also read elsewhere (logging, another loss): no fix is offered; "
            f"remove the division by `{code(division.world_size)}` from the backward's path only"
        )
    message = f"Remove the division by `{code(division.world_size)}`"
    if division.rest is not None:
        edit = _replace_with_parens(ctx, division.divisor, _atom(division.rest))
        return make_fix(message, edit), None
    if division.node is None or _divides_itself(d, division.node):
        return make_fix(message, _delete_statement(ctx, d.stmt)), None
    edit = _replace_with_parens(ctx, division.node, _atom(division.node.left))
    return make_fix(message, edit), None


def _replace_with_parens(ctx, node, content: str) -> Edit:
    """Replace an expression together with its own parentheses (`(W * K)` becomes `K`)."""
    start, end = ctx.span(node)
    if node.lpar:
        start, end = ctx.span(node.lpar[0])[0], ctx.span(node.rpar[-1])[1]
    return Edit(start, end, content)


def _atom(node) -> str:
    text = code(node)
    return text if isinstance(node, _ATOMS) or node.lpar else f"({text})"


def _divides_itself(d, node) -> bool:
    """`loss = loss / W`: without the division the statement would do nothing."""
    return d is not None and d.value is node and code(node.left) == d.target


def _delete_statement(ctx, stmt) -> Edit | None:
    """Remove a statement that is alone on its line and not alone in its block."""
    line = stmt.line
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    frames = [f for f in stmt.frames if f.kind != FrameKind.EXIT]
    block = _body_of(frames[-1]) if frames else None
    if block is not None and len(block) == 1:
        return None
    first, last = ctx.span(line)[0].line, ctx.span(line)[1].line
    if last >= len(ctx.lines):
        return None
    return Edit(Position(first, 0), Position(last + 1, 0), "")


def _body_of(frame):
    node = frame.node
    if isinstance(node, cst.If) and not frame.holds:
        orelse = node.orelse
        suite = orelse.body if isinstance(orelse, cst.Else) else None
    else:
        suite = getattr(node, "body", None)
    return suite.body if isinstance(suite, cst.IndentedBlock) else None


def _feeds_only_the_backward(loop, site, d) -> bool:
    """The divided name is read by the backward and by its own later reassignments only (a
    logged or reused value keeps its meaning otherwise)."""
    name = d.target
    chain = {id(x.stmt) for x in d.stmt.scope.defs.get(name, ()) if _reads(x.stmt.node, name)}
    for stmt in d.stmt.scope.stmts:
        if stmt is d.stmt or stmt is site.stmt or id(stmt) in chain:
            continue
        if stmt.order < d.stmt.order and not any(f.node is loop.node for f in stmt.frames):
            continue  # before the loop: an older value
        if _reads(stmt.node, name):
            return False
    return True


def _reads(node, name: str) -> bool:
    head = name.split(".", 1)[0]
    return any(isinstance(n, cst.Name) and n.value == head for n in walk(node))
