"""ACL106: an fp16 autocast forward that is backpropagated with no GradScaler in the module."""

from __future__ import annotations

from linter.context import RuleContext
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


def check(ctx: RuleContext) -> None:
    """Report fp16 autocast regions whose forward reaches a backward in the same function, when
    nothing in the module scales the loss."""
    model = ctx.model
    if live_scalers(model) or _engine_owns_precision(model):
        return  # a scaler anywhere in the module (even one passed elsewhere) scales the loss
    for cast in autocasts(model):
        if _fp16_on_gpu(cast) and not under_no_grad(model, cast.region):
            backward = _trained_backward(model, cast)
            if backward is not None:
                _report(ctx, cast, backward)


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


def _trained_backward(model, cast: Autocast):
    """The first unscaled backward of the region's function whose loss flows from a statement
    inside the region through a model that trains (a frozen teacher's fp16 outputs carry no
    gradient into fp16 activations)."""
    scope = region_scope(model, cast.region)
    if scope is None or _scaler_in_reach(model, scope):
        return None
    frozen = frozen_names(model)
    for loop in model.loops:
        for site in loop.backwards:
            if site.stmt.scope is not scope or _scaled(model, site) or _vjp(model, site):
                continue
            if site.kind == "engine_backward" and not _fp32_engine(model, site):
                continue
            if _inside(site.stmt, cast) or _flows_through(model, site, cast, frozen):
                return site
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
    if site.kind != "backward" or model.is_backward_function(site.call):
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
