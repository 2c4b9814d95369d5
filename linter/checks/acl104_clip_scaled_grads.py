"""ACL104: torch's clip functions applied to gradients still multiplied by the loss scale."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.edits import insert_before
from linter.model import scaler_clipping as clipping
from linter.model.cst_util import code, last_part
from linter.model.precision_runs import scaler_configuration

# `torch.nn.utils.clip_grad_norm_` arguments that `accelerator.clip_grad_norm_` also takes.
_ENGINE_CLIP_ARGS = {"parameters", "max_norm", "norm_type"}


def check(ctx: RuleContext) -> None:
    """Report torch clips of scaled gradients: after `scaler.scale(...).backward()` with no
    `unscale_` between, or under an engine whose precision may be fp16 (or with FSDP)."""
    model = ctx.model
    for body in clipping.bodies(model):
        for clip in clipping.unscaled_clips(model, body):
            _report_raw(ctx, clip)
        for clip in clipping.engine_clips(model, body):
            _report_engine(ctx, clip)


def _name(site) -> str:
    return last_part(code(site.call.func))


def _report_raw(ctx, clip: clipping.ScaledClip) -> None:
    scaler = clip.scaled.scaler
    optimizer = clipping.unscale_target(ctx.model, clip)
    fix = None
    hint = f"call `{scaler}.unscale_(optimizer)` before it"
    if optimizer is not None:
        hint = f"call `{scaler}.unscale_({optimizer})` before it"
        edit = insert_before(ctx, clip.site.stmt, f"{scaler}.unscale_({optimizer})")
        fix = make_fix(f"Unscale first: `{scaler}.unscale_({optimizer})`", edit)
    ctx.report(
        clip.site.call,
        f"`{_name(clip.site)}` clips gradients that `{scaler}.scale(...)` still multiplies by the "
        f"loss scale: the norm is compared with the threshold that many times too large and "
        f"nearly every step is clipped to almost nothing ({hint})",
        fix,
        configuration=scaler_configuration(ctx.model, scaler),
    )


def _report_engine(ctx, clip: clipping.EngineClip) -> None:
    engine, site = clip.engine, clip.site
    name = _name(site)
    if clip.fsdp:
        why = "with FSDP it computes a per-shard norm, so ranks clip by different factors"
    elif clip.precision == "fp16":
        why = "under fp16 the gradients are still multiplied by the loss scale"
    else:
        why = "under fp16 (the precision is not statically known) the gradients would still be "
        why += "multiplied by the loss scale"
    fix = None
    if name == "clip_grad_value_":
        if clip.first:
            edit = insert_before(ctx, site.stmt, f"{engine}.unscale_gradients()")
            fix = make_fix(f"Unscale first: `{engine}.unscale_gradients()`", edit)
        use = f"call `{engine}.unscale_gradients()` before it"
    else:
        if clip.first and _engine_takes(site.call):
            edit = ctx.replace(site.call.func, f"{engine}.clip_grad_norm_")
            fix = make_fix(f"Use `{engine}.clip_grad_norm_`", edit)
        use = f"use `{engine}.clip_grad_norm_`, which unscales first"
    ctx.report(
        site.call,
        f"torch's `{name}` skips what `{engine}` does before clipping: {why} ({use})",
        fix,
    )


def _engine_takes(call: cst.Call) -> bool:
    """Whether the engine's `clip_grad_norm_(parameters, max_norm, norm_type)` accepts the
    arguments as written (not `error_if_nonfinite=`, `foreach=`, `*args`)."""
    if any(a.star for a in call.args):
        return False
    if sum(1 for a in call.args if a.keyword is None) > 3:
        return False
    return all(a.keyword is None or a.keyword.value in _ENGINE_CLIP_ARGS for a in call.args)
