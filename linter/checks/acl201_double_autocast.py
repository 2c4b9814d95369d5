"""ACL201's static check (the record and docs: `rules/acl201_double_autocast.py`)."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.model.cst_util import is_false, keyword
from linter.model.kinds import FrameKind, RegionKind


def check(ctx: RuleContext) -> None:
    """Report user autocast regions nested in another one or around a low-precision prepared
    model."""
    model = ctx.model
    if not model.has_training_loop():
        return  # inference-only files (pipelines, samplers) use autocast on purpose
    for region in model.regions:
        if region.kind != RegionKind.AUTOCAST or not _enabled(region.call):
            continue
        outer = _enclosing_autocast(model, region)
        if outer is not None:
            _report_nested(ctx, region, outer)
            continue
        prepared = _prepared_call_inside(model, region)
        if prepared is not None:
            _report_prepared(ctx, region, *prepared)


def _enabled(call) -> bool:
    return not is_false(keyword(call, "enabled"))


def _enclosing_autocast(model, region):
    inner = {id(f.node) for f in region.frames[:-1] if f.kind == FrameKind.WITH}
    for other in model.regions:
        if other is region or other.kind != RegionKind.AUTOCAST or not _enabled(other.call):
            continue
        if id(other.with_node) in inner:
            return other
    return None


def _prepared_call_inside(model, region):
    """(called name, engine) for a call of a prepared fp16/bf16 model inside the region."""
    for call in model.calls_in_with(region.with_node):
        if not model.is_prepared(call.func, call.stmt.scope):
            continue
        prepared = model.setup.prepared[call.func]
        engine = model.setup.engines.get(prepared.engine)
        if engine is not None and engine.mixed_precision in ("fp16", "bf16"):
            return call.func, engine
    return None


def _report_nested(ctx, region, outer) -> None:
    fix = None
    if len(region.with_node.items) == 1 and region.item.asname is None:
        fix = make_fix(
            "Remove the inner autocast region",
            ctx.unwrap_with(region.with_node),
        )
    ctx.report(
        region.item.item,
        f"autocast region nested inside another enabled autocast region (line "
        f"{ctx.line_of(outer.item.item)}): the inner one overrides the outer, so one of them is "
        "redundant or switches dtype mid-computation",
        fix,
    )


def _report_prepared(ctx, region, called: str, engine) -> None:
    scope = _scope_of(ctx.model, region)
    name = ctx.model.engine_in_scope(scope) if scope is not None else None
    name = name or engine.name
    fix = None
    if not region.via_name:  # `with ctx:`: the call is bound elsewhere and may be reused
        fix = make_fix(
            f"Use `{name}.autocast()`",
            ctx.replace(region.call, f"{name}.autocast()"),
        )
    ctx.report(
        region.item.item,
        f"autocast around `{called}`, which `{name}` already runs in "
        f"{engine.mixed_precision}: the loss and other code in this region also run in low "
        f"precision instead of fp32 (use `{name}.autocast()` or remove the region)",
        fix,
    )


def _scope_of(model, region):
    for scope in model.scopes:
        if any(w is region.with_node for w, _ in scope.withs):
            return scope
    return None
