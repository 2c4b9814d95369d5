"""ACL204: a user autocast whose dtype disagrees with the engine's precision, or
`accelerator.autocast()` under an engine pinned to fp32."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext
from linter.model import grad_reach, precision_runs
from linter.model.cst_util import is_false, keyword
from linter.model.kinds import FrameKind, SiteKind
from linter.model.precision import (
    BF16,
    FP16,
    Autocast,
    autocasts,
    engine_precision,
    engines,
    region_scope,
    under_no_grad,
)
from linter.types import Configuration


def check(ctx: RuleContext) -> None:
    """Compare every enabled autocast region with the precision all engines of the module are
    statically set to; nothing to compare when it is not statically known (a config file, the
    CLI) or when there is no engine."""
    precision = engine_precision(ctx.model)
    if precision is None:
        _check_configured(ctx)
        return
    for cast in autocasts(ctx.model):
        if cast.enabled is False:
            continue  # an fp32 island
        if cast.by_engine:
            if precision == "no":
                _report_noop(ctx, cast)
        elif _conflicts(cast, precision) and _may_conflict(ctx.model, cast, precision):
            _report_conflict(ctx, cast, precision)


def _may_conflict(model, cast: Autocast, precision: str | None = None) -> bool:
    """A CPU region changes only CPU ops, where a CUDA engine computes nothing and Accelerate
    applies no fp16 (ACL602's): compared only with a bf16 engine pinned to the CPU. A region
    whose values never reach a backward of its function (validation inside the epoch loop, a
    frozen helper model's output cut to uint8) trains nothing."""
    if cast.device == "cpu":
        if precision == FP16 or not any(_on_cpu(e) for e in engines(model)):
            return False
    scope = region_scope(model, cast.region)
    return grad_reach.feeds_a_backward(model, scope, cast.region.with_node) is not False


def _on_cpu(engine) -> bool:
    value = keyword(engine.node, "cpu") if isinstance(engine.node, cst.Call) else None
    return value is not None and not is_false(value)


def _check_configured(ctx: RuleContext) -> None:
    """An engine whose precision comes from a knob with known values (`Accelerator(
    mixed_precision=args.mixed_precision)`, `choices=["no", "fp16", "bf16"]`) beside a user
    region whose dtype disagrees for some of them. Without known values (a config file, a
    free-form flag) there is nothing to compare, as in the static case."""
    model = ctx.model
    built = engines(model)
    if not built:
        return
    count = len(built)
    for cast in autocasts(model):
        if cast.by_engine or cast.enabled is False or _inference_only(model, cast):
            continue
        if not _may_conflict(model, cast):
            continue
        exprs = [*precision_runs.engine_exprs(model, built), precision_runs.cast_expr(model, cast)]

        def bad(values) -> bool:
            found = {precision_runs.engine_precision(v) for v in values[:count]}
            word = precision_runs.dtype_word(values[count])
            if len(found) != 1 or word not in (FP16, BF16):
                return False
            (precision,) = found
            return precision in (FP16, BF16) and precision != word

        verdict = precision_runs.runs_where(model, exprs, bad)
        if verdict is None or not verdict.condition.depends:
            continue
        row = verdict.rows[0]
        precision = precision_runs.engine_precision(row.values[0])
        word = precision_runs.dtype_word(row.values[count])
        _report_conflict(ctx, cast, precision, word, verdict.condition)


def _inference_only(model, cast: Autocast) -> bool:
    """A region no backward can follow: under `no_grad`, or with no backward after it in its
    function nor in a loop around it (diffusers' validation pipeline in `log_validation`, the
    final inference after the training loop): whatever the flag, nothing there is trained."""
    if under_no_grad(model, cast.region):
        return True
    scope = region_scope(model, cast.region)
    found = precision_runs.cast_expr(model, cast)
    if scope is None or found is None:
        return True
    start = found[2]
    loops = {id(f.node) for f in cast.region.frames if f.kind == FrameKind.LOOP}
    for site in model.sites.get(id(scope), []):
        if site.kind not in (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD):
            continue
        if site.stmt.order > start or any(id(f.node) in loops for f in site.stmt.frames):
            return False
    return True


def _conflicts(cast: Autocast, precision: str) -> bool:
    """A user region in fp16 under a bf16 engine or the reverse. Under "no" the user's region
    is the only one (their own AMP, judged by ACL106). A region around the prepared model is
    also ACL201's; its fix (`accelerator.autocast()`) resolves both."""
    return precision in (FP16, BF16) and cast.dtype in (FP16, BF16) and cast.dtype != precision


def _report_conflict(
    ctx: RuleContext, cast: Autocast, precision: str, dtype=None, condition=None
) -> None:
    scope = region_scope(ctx.model, cast.region) or ctx.model.scopes[0]
    engine = ctx.model.engine_in_scope(scope) or "accelerator"
    how = "written" if cast.explicit else f"the {cast.device or 'cuda'} default"
    when = f" {condition.text}" if condition is not None else ""
    ctx.report(
        cast.region.item.item,
        f"autocast in {dtype or cast.dtype} ({how}) while `{engine}` trains in {precision}"
        f"{when}: mixing Half and BFloat16 tensors fails outside autocast's ops, and fp16 "
        f"without a scaler underflows (use `{engine}.autocast()`, or write dtype=torch."
        f"{'bfloat16' if precision == BF16 else 'float16'})",
        configuration=None
        if condition is None
        else Configuration(condition.affects_default, condition.text, condition.knobs),
    )


def _report_noop(ctx: RuleContext, cast: Autocast) -> None:
    name = cast.region.receiver or "accelerator"
    ctx.report(
        cast.region.item.item,
        f'`{name}.autocast()` does nothing: the engine is pinned to mixed_precision="no", so '
        "this region runs in fp32 (set the engine's mixed_precision, or remove the region)",
    )
