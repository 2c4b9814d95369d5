"""ACL107: trainable parameters stored in fp16 under a GradScaler or an fp16 engine, or in a low
precision while gradients accumulate."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model.kinds import FrameKind
from linter.model.param_dtypes import ParamCast, accumulates, param_casts
from linter.model.precision import FP16, engine_precision_of, engines, live_scalers
from linter.model.precision_runs import scaler_configuration


def check(ctx: RuleContext) -> None:
    """Report casts of trained models (parameters reaching an optimizer, not frozen) to fp16
    under fp16 mixed precision, and to fp16/bf16 under accumulation."""
    model = ctx.model
    casts = [c for c in param_casts(model) if c.trained and not c.frozen]
    if not casts:
        return
    scaler = _fp16_training(model)
    accumulating = accumulates(model)
    for cast in casts:
        if cast.dtype == FP16 and scaler is not None:
            _report_scaled(ctx, cast, *scaler)
        elif accumulating:
            _report_accumulated(ctx, cast)


def _fp16_training(model) -> tuple[str, str | None] | None:
    """What unscales fp16 gradients here (a GradScaler that may be enabled, or an fp16 engine),
    and the scaler's name when it is one."""
    for scaler in live_scalers(model):
        return f"the GradScaler `{scaler.name}`", scaler.name
    for engine in engines(model):
        if engine_precision_of(engine) == "fp16":
            return f"`{engine.name}` (fp16)", None
    return None


def _report_scaled(ctx: RuleContext, cast: ParamCast, scaler: str, name: str | None) -> None:
    # The unscale fails only in the runs where the scaler scales; an unconditional cast makes
    # those the runs of the finding (a cast under an `if` may have a switch of its own: untold).
    conditional = any(frame.kind == FrameKind.IF for frame in cast.stmt.frames)
    ctx.report(
        cast.node,
        f"`{cast.name}` is cast to fp16 and trained with {scaler}: its gradients are fp16 too, "
        'and unscale_ rejects them ("Attempting to unscale FP16 gradients") at the first clip '
        "or step (keep the trained weights in fp32; autocast does the fp16 math)",
        configuration=None if conditional else scaler_configuration(ctx.model, name),
    )


def _report_accumulated(ctx: RuleContext, cast: ParamCast) -> None:
    """A warning: precision is lost gradually, nothing fails (the guard's level too)."""
    ctx.report(
        cast.node,
        f"`{cast.name}` is trained in {cast.dtype} while gradients accumulate over several "
        f"micro-steps: each addition into the {cast.dtype} `.grad` drops low-order bits, so the "
        "precision loss grows with K (keep the trained weights in fp32, or accumulate in fp32 "
        "buffers)",
        severity="warning",
    )
