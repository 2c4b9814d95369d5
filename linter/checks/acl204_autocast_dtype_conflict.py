"""ACL204: a user autocast whose dtype disagrees with the engine's precision, or
`accelerator.autocast()` under an engine pinned to fp32."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model.precision import (
    BF16,
    FP16,
    Autocast,
    autocasts,
    engine_precision,
    region_scope,
)


def check(ctx: RuleContext) -> None:
    """Compare every enabled autocast region with the precision all engines of the module are
    statically set to; nothing to compare when it is not statically known (a config file, the
    CLI) or when there is no engine."""
    precision = engine_precision(ctx.model)
    if precision is None:
        return
    for cast in autocasts(ctx.model):
        if cast.enabled is False:
            continue  # an fp32 island
        if cast.by_engine:
            if precision == "no":
                _report_noop(ctx, cast)
        elif _conflicts(cast, precision):
            _report_conflict(ctx, cast, precision)


def _conflicts(cast: Autocast, precision: str) -> bool:
    """A user region in fp16 under a bf16 engine or the reverse. Under "no" the user's region
    is the only one (their own AMP, judged by ACL106). A region around the prepared model is
    also ACL201's; its fix (`accelerator.autocast()`) resolves both."""
    return precision in (FP16, BF16) and cast.dtype in (FP16, BF16) and cast.dtype != precision


def _report_conflict(ctx: RuleContext, cast: Autocast, precision: str) -> None:
    scope = region_scope(ctx.model, cast.region) or ctx.model.scopes[0]
    engine = ctx.model.engine_in_scope(scope) or "accelerator"
    how = "written" if cast.explicit else f"the {cast.device} default"
    ctx.report(
        cast.region.item.item,
        f"autocast in {cast.dtype} ({how}) while `{engine}` trains in {precision}: mixing Half "
        f"and BFloat16 tensors fails outside autocast's ops, and fp16 without a scaler "
        f"underflows (use `{engine}.autocast()`, or write dtype=torch."
        f"{'bfloat16' if precision == BF16 else 'float16'})",
    )


def _report_noop(ctx: RuleContext, cast: Autocast) -> None:
    name = cast.region.receiver or "accelerator"
    ctx.report(
        cast.region.item.item,
        f'`{name}.autocast()` does nothing: the engine is pinned to mixed_precision="no", so '
        "this region runs in fp32 (set the engine's mixed_precision, or remove the region)",
    )
