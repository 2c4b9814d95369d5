"""ACL106: an fp16 autocast forward that is backpropagated with no GradScaler in the module."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model import precision_runs
from linter.model.kinds import SiteKind
from linter.model.param_dtypes import frozen_names
from linter.model.precision import (
    FP16,
    Autocast,
    autocasts,
    engine_precision_of,
    engines,
    live_scalers,
    region_scope,
    under_no_grad,
)
from linter.model.scaler_protocol import scaler_of_backward


def check(ctx: RuleContext) -> None:
    """Report fp16 autocast regions whose forward reaches a backward in the same function, when
    nothing in the module scales the loss."""
    model = ctx.model
    if _engine_owns_precision(model):
        return
    scalers = live_scalers(model)
    for cast in autocasts(model):
        if cast.by_engine or under_no_grad(model, cast.region):
            continue
        if not scalers and _fp16_on_gpu(cast):
            backward = _trained_backward(model, cast)
            if backward is not None:
                _report(ctx, cast, backward)
                continue
        _report_configured(ctx, cast, scalers)


def _report_configured(ctx: RuleContext, cast: Autocast, scalers) -> None:
    """fp16 without loss scaling in some configurations only: the region's dtype and the
    scaler's `enabled=` read the same knob differently (`autocast("cuda")` beside
    `GradScaler(enabled=(dtype == "float16"))`, or a `--dtype float16` choice and no scaler).
    A scaler anywhere in the module whose state the linter cannot evaluate keeps it quiet."""
    model = ctx.model
    region = precision_runs.cast_expr(model, cast)
    if (
        not _fp16_on_gpu(cast)
        and precision_runs.runs_where(
            model, [region], lambda values: precision_runs.fp16_on_gpu(values[0])
        )
        is None
    ):
        return  # fp16 in no configuration: the backward's flow need not be traced
    found = _trained_backward(model, cast, scaled=True)
    if found is None:
        return
    backward, scaler = found
    if scaler is not None:
        chosen = [s for s in scalers if s.name == scaler]
        if not chosen:
            return  # a scaler handed in from elsewhere: its state is out of sight
    else:
        chosen = scalers
    exprs = [region, *precision_runs.scaler_exprs(model, chosen)]

    def bad(values) -> bool:
        if not precision_runs.fp16_on_gpu(values[0]):
            return False
        return all(precision_runs.scaler_off(v) for v in values[1:])

    verdict = precision_runs.runs_where(model, exprs, bad)
    if verdict is None or not verdict.condition.depends:
        return
    condition = verdict.condition
    how = "float16 by default on CUDA" if not cast.explicit else "float16"
    if scaler is not None:
        unscaled = f"where `{scaler}` is disabled"
        advice = (
            "key the autocast dtype and the scaler's `enabled=` on the same setting: "
            "dtype=torch.bfloat16 with the scaler off, or float16 with it on"
        )
    else:
        unscaled = "and the module builds no GradScaler that is on then"
        advice = "scale the loss with a torch.amp.GradScaler enabled for float16"
    ctx.report(
        cast.region.item.item,
        f"autocast runs this forward in {how} {condition.text}, {unscaled}: its loss is "
        f"backpropagated on line {ctx.line_of(backward.call)} without loss scaling, and "
        f"gradients below ~6e-8 flush to zero in the fp16 backward ({advice})",
        configuration=_configuration(condition),
    )


def _configuration(condition):
    from linter.types import Configuration

    return Configuration(condition.affects_default, condition.text, condition.knobs)


def _engine_owns_precision(model) -> bool:
    """An engine in fp16, bf16 or an unknown precision owns the run's precision: its backward
    scales (fp16), a raw backward is ACL101's, and a user region of another dtype is ACL204's.
    Only an engine pinned to "no" leaves the user's own AMP to this rule."""
    return any(engine_precision_of(e) != "no" for e in engines(model))


def _fp16_on_gpu(cast: Autocast) -> bool:
    """An enabled user region in fp16: written, or omitted on a device that is not literally
    "cpu" (whose default is bf16). A dtype taken from a variable, or a region factory handed in
    as a parameter (`with autocast():`, which may be a `nullcontext`), is not statically fp16."""
    if cast.by_engine or cast.enabled is False or cast.device == "cpu":
        return False
    return (cast.explicit and cast.dtype == FP16) or cast.fp16_by_default


def _trained_backward(model, cast: Autocast, scaled: bool = False):
    """The first unscaled backward of the region's function whose loss flows from a statement
    inside the region through a model that trains (a frozen teacher's fp16 outputs carry no
    gradient into fp16 activations). With `scaled`, a backward through a module scaler counts
    too, as `(site, scaler name)` (`(site, None)` for an unscaled one): that scaler may be off."""
    scope = region_scope(model, cast.region)
    if scope is None:
        return None
    frozen = frozen_names(model)
    for loop in model.loops:
        for site in loop.backwards:
            if site.stmt.scope is not scope or _vjp(model, site):
                continue
            scaler = scaler_of_backward(model, site) if scaled else None
            if scaler is None and (_scaled(model, site) or _scaler_in_reach(model, scope)):
                continue
            if site.kind == SiteKind.ENGINE_BACKWARD and not _fp32_engine(model, site):
                continue
            if _inside(site.stmt, cast) or _flows_through(model, site, cast, frozen):
                return (site, scaler) if scaled else site
    return None


def _scaler_in_reach(model, scope) -> bool:
    """A scaler handed to the function (`train_one_epoch(..., scaler)`, `loss_scaler(loss,
    opt)`): built in another module, it scales this loss."""
    names = set(scope.params) | {c.receiver or c.func or "" for c in scope.calls}
    return any(model.scaler_role(name, scope) is not None for name in names if name)


def _scaled(model, site) -> bool:
    call = site.call
    receiver = getattr(call.func, "value", None)
    return receiver is not None and model.is_scaled_loss(receiver, site.stmt.scope, site.stmt.order)


def _fp32_engine(model, site) -> bool:
    """Whether an engine's backward is known not to scale: an Accelerator or guard engine pinned
    to "no". DeepSpeed, Fabric or an engine of unknown precision may scale it themselves."""
    engine = model.engine_for(site.receiver, site.stmt.scope)
    return engine is not None and engine_precision_of(engine) == "no"


def _vjp(model, site) -> bool:
    """`out.backward(grad_out)`: a gradient handed in for a non-scalar output (a gradient test,
    a vector-Jacobian product), not a loss being trained."""
    if site.kind != SiteKind.BACKWARD or model.is_backward_function(site.call):
        return False
    return any(a.keyword is None and not a.star for a in site.call.args)


def _inside(stmt, cast: Autocast) -> bool:
    return any(f.node is cast.region.with_node for f in stmt.frames)


def _flows_through(model, site, cast: Autocast, frozen: set[str]) -> bool:
    flow = model.flow(site)
    if flow is None or not any(_inside(stmt, cast) for _, stmt in flow.steps):
        return False
    called = {c.func for c in model.calls_in_with(cast.region.with_node) if _is_object(model, c)}
    return not called or not called <= frozen


def _is_object(model, call) -> bool:
    """A call of an object held in a variable (a model), not of an imported function."""
    name = call.func
    if not name or model.imports.is_imported(call.call.func):
        return False
    return bool(model.module_defs(name)) or name in call.stmt.scope.params


def _report(ctx: RuleContext, cast: Autocast, backward) -> None:
    how = "float16 by default on CUDA" if not cast.explicit else "float16"
    ctx.report(
        cast.region.item.item,
        f"autocast runs this forward in {how}, and its loss is backpropagated on line "
        f"{ctx.line_of(backward.call)} with no GradScaler in the module: gradients below ~6e-8 "
        "flush to zero in the fp16 backward (choose dtype=torch.bfloat16, or keep fp16 and "
        "scale the loss with a torch.amp.GradScaler)",
    )
