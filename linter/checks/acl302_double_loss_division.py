"""ACL302: a loss divided by K by hand before an engine backward that divides by K again."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model import accumulation
from linter.model.config_space import k_configuration
from linter.model.cst_util import code, dotted, int_value, strip_parens, walk
from linter.model.dataflow import Flow
from linter.model.functions import Def, Stmt
from linter.model.kinds import EngineKind, SiteKind
from linter.types import Edit, Position

_DIVIDING_ENGINES = (
    EngineKind.ACCELERATE,
    EngineKind.GUARD,
    EngineKind.DEEPSPEED,
    EngineKind.UNKNOWN,
)


def check(ctx: RuleContext) -> None:
    """Report engine backward calls whose loss was already divided by the engine's K."""
    model = ctx.model
    for sites in model.sites.values():
        for site in sites:
            engine = _dividing_engine(model, site)
            if engine is None:
                continue
            flow = model.flow(site)
            if flow is None:
                continue
            repeated = _repeated_divisors(model, engine, flow, site.stmt)
            if repeated and not _multiplied_back(model, flow, site, len(repeated)):
                _report(ctx, site, engine, flow, repeated)


def _dividing_engine(model, site) -> str | None:
    """The engine of `engine.backward(loss)` when that backward divides by K itself (Fabric's
    and Lightning's `manual_backward` do not; an optimizer's `backward` is not an engine's)."""
    if site.kind != SiteKind.ENGINE_BACKWARD or not model.divides_by_k(site):
        return None
    engine = model.engine_for(site.receiver, site.stmt.scope)
    if engine is None or engine.kind not in _DIVIDING_ENGINES:
        return None
    return site.receiver


def _repeated_divisors(model, engine: str, flow: Flow, stmt: Stmt) -> list[cst.BaseExpression]:
    scope = stmt.scope
    return [
        d
        for d in flow.divisors
        if accumulation.divides_like_engine(model, engine, _k_of(d), scope)
        and not _on_another_path(flow, d, stmt)
    ]


def _on_another_path(flow: Flow, divisor, backward: Stmt) -> bool:
    """`if not do_backward: loss /= K; loss.backward() else: accelerator.backward(loss)`: the
    division sits in a branch that never reaches this backward."""
    for _, stmt in flow.steps:
        if any(node is divisor for node in walk(stmt.node)):
            return accumulation.exclusive(stmt.frames, backward.frames)
    return False


def _k_of(divisor: cst.BaseExpression) -> cst.BaseExpression:
    """K in `1 / K` (a loss multiplied by the reciprocal), else the divisor itself."""
    inner = strip_parens(divisor)
    if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Divide):
        if int_value(inner.left) == 1 or code(inner.left) == "1.0":
            return inner.right
    return divisor


def _multiplied_back(model, flow: Flow, site, divisions: int) -> bool:
    """`loss * K / n_items` style normalisation: the path multiplies K back as often as it
    divides by it, so the engine's division is the only one left."""
    roots = [stmt.node for _, stmt in flow.steps] + [site.call]
    scope = site.stmt.scope
    products = 0
    for root in roots:
        for node in walk(root):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
                sides = (node.left, node.right)
                products += sum(accumulation.spells_k(model, s, scope) for s in sides)
            elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.MultiplyAssign):
                products += accumulation.spells_k(model, node.value, scope)
    return products >= divisions


def _report(ctx: RuleContext, site, engine: str, flow: Flow, repeated) -> None:
    k = _k_of(repeated[0])
    n = code(strip_parens(k))
    shown = n if int_value(k) is not None else f"`{n}`"
    loss = ctx.model.loss_expr(site)
    fix = _fix(ctx, site, repeated) if len(repeated) == 1 else None
    notes = ()
    if fix is None:
        where = ctx.line_of(repeated[0])
        notes = (
            f"remove the division by {shown} at line {where}: no fix is offered because the "
            "divided value is also used elsewhere (a log line, a second loss)",
        )
    ctx.report(
        site.call,
        f"`{code(loss)}` is divided by {shown} by hand, and `{engine}.backward` divides by the "
        f"accumulation steps again: the gradients are {shown} times too small (each micro-batch "
        "weighs 1/K² instead of 1/K)",
        fix,
        notes=notes,
        configuration=k_configuration(ctx.model, k, site.stmt.scope),
    )


# --- the fix ------------------------------------------------------------------------------
def _fix(ctx: RuleContext, site, repeated):
    """Remove the division when the divided value feeds nothing but this backward."""
    divisor = repeated[0]
    original = ctx.model.loss_expr(site)
    argument = strip_parens(original)
    inline = _without_division(argument, divisor)
    if inline is not None:
        return make_fix("Remove the manual division", ctx.replace(original, inline))
    if not isinstance(argument, cst.Name):
        return None
    d = _dividing_def(site.stmt, argument.value, divisor)
    if d is None or not _single_use(site.stmt, d, argument.value):
        return None
    return make_fix("Remove the manual division", _undo(ctx, d, divisor, site.stmt))


def _without_division(expr, divisor) -> str | None:
    """The text of `expr` without its outermost `/ K` (or `* (1 / K)`), when that is where the
    divisor sits."""
    expr = strip_parens(expr)
    if not isinstance(expr, cst.BinaryOperation):
        return None
    if isinstance(expr.operator, cst.Divide) and expr.right is divisor:
        return code(expr.left)
    if isinstance(expr.operator, cst.Multiply):
        if expr.right is divisor:
            return code(expr.left)
        if expr.left is divisor:
            return code(expr.right)
    return None


def _dividing_def(stmt: Stmt, name: str, divisor) -> Def | None:
    """The last assignment of `name` before the backward, when it holds the division."""
    defs = stmt.scope.defs_before(name, stmt.order)
    if not defs or defs[-1].tuple_index is not None:
        return None
    d = defs[-1]
    if d.op in ("/=", "*=") and d.value is divisor:
        return d
    if d.op == "=" and _without_division(d.value, divisor) is not None:
        return d
    return None


def _single_use(stmt: Stmt, d: Def, name: str) -> bool:
    """`name` is read only by the backward (and, for `loss = loss / K`, by the division that
    rebinds it, or by earlier assignments building the same loss)."""
    scope = stmt.scope
    if name in scope.header_reads:
        return False
    for other in scope.stmts:
        reads = sum(isinstance(n, cst.Name) and n.value == name for n in walk(other.node))
        if other is stmt:
            if reads != 1:
                return False
        elif reads and not _builds_the_loss(other, d, name):
            return False
    return True


def _builds_the_loss(other: Stmt, d: Def, name: str) -> bool:
    """An assignment of `name` at or before the dividing one (`loss = loss.mean()`)."""
    node = other.node
    targets = []
    if isinstance(node, cst.Assign):
        targets = [dotted(t.target) for t in node.targets]
    elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
        targets = [dotted(node.target)]
    return name in targets and other.order <= d.stmt.order and other.scope is d.stmt.scope


def _undo(ctx: RuleContext, d: Def, divisor, backward: Stmt) -> Edit | None:
    """`loss = out.loss / K` keeps `loss = out.loss`; `loss /= K` and `loss = loss / K` go,
    when they are whole lines of the backward's own block (which then still holds a statement)."""
    stmt = d.stmt
    kept = None if d.op != "=" else _without_division(d.value, divisor)
    if kept is not None and kept != d.target:
        return ctx.replace(d.value, kept)
    if len(stmt.line.body) != 1 or not isinstance(stmt.line, cst.SimpleStatementLine):
        return None
    if stmt.frames != backward.frames:
        return None
    first, last = ctx.span(stmt.line)[0].line, ctx.span(stmt.line)[1].line
    return Edit(Position(first, 0), Position(last + 1, 0), "")
