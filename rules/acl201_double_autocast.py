"""ACL201 double-autocast: a user autocast region around a prepared model, or nested in another."""

from rules._base import Rule

RULE = Rule(
    code="ACL201",
    name="double-autocast",
    summary="user autocast around a prepared model (or inside another region) runs loss code in "
    "low precision",
    severity="error",
    fix="unsafe",
    runtime="partial",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags a `torch.autocast(...)` / `torch.amp.autocast(...)` / `torch.cuda.amp.autocast(...)` region
that encloses a call of a model prepared by an Accelerator or guard engine whose precision is
statically fp16 or bf16, and an enabled autocast region nested lexically inside another enabled one.

## Why is this bad?
A prepared model already runs its forward under the engine's autocast and hands back fp32 outputs,
so that the loss is computed in fp32. Wrapping the call in a second region changes nothing inside
the model, but everything else in the region (loss, auxiliary heads, metrics) now runs in fp16 or
bf16, which defeats the fp32-output design: a custom loss using `exp` or a matmul can overflow in
fp16. Two nested user regions are just as confusing: the inner one wins, so either it is dead code
or it switches dtype halfway through a computation.

## Example
```python
accelerator = Accelerator(mixed_precision="fp16")
model = accelerator.prepare(model)
with torch.autocast("cuda", dtype=torch.float16):
    loss = info_nce(model(x), temperature=0.05)     # loss math in fp16
```

## Use instead
```python
accelerator = Accelerator(mixed_precision="fp16")
model = accelerator.prepare(model)
loss = info_nce(model(x), temperature=0.05)         # fp32 outputs, fp32 loss
```

## Fix safety
Unsafe. For nested user regions the inner `with` is removed and its body dedented; for a region
around a prepared model, `torch.autocast(...)` is replaced by `accelerator.autocast()`, so the
region follows the engine's precision. Both edits change which operations run in low precision,
and the replacement takes the engine's dtype, which may not be the one the user wrote.

## At runtime
The prepared model's forward pre-hook runs before the engine enters its own autocast; if
`torch.is_autocast_enabled(dev)` is already true there, the guard reports ACL201 with the ambient
`torch.get_autocast_dtype(dev)`. A dtype different from the engine's is reported as ACL204.
Nested user regions that do not wrap a prepared model are visible only to the linter.
""",
)


def check(ctx) -> None:
    """Report user autocast regions nested in another one or around a low-precision prepared
    model."""
    model = ctx.model
    if not model.has_training_loop():
        return  # inference-only files (pipelines, samplers) use autocast on purpose
    for region in model.regions:
        if region.kind != "autocast" or not _enabled(region.call):
            continue
        outer = _enclosing_autocast(model, region)
        if outer is not None:
            _report_nested(ctx, region, outer)
            continue
        prepared = _prepared_call_inside(model, region)
        if prepared is not None:
            _report_prepared(ctx, region, *prepared)


def _enabled(call) -> bool:
    from linter.model.cst_util import is_false, keyword

    return not is_false(keyword(call, "enabled"))


def _enclosing_autocast(model, region):
    inner = {id(f.node) for f in region.frames[:-1] if f.kind == "with"}
    for other in model.regions:
        if other is region or other.kind != "autocast" or not _enabled(other.call):
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
    from linter.context import make_fix

    fix = None
    if len(region.with_node.items) == 1 and region.item.asname is None:
        fix = make_fix(
            "Remove the inner autocast region",
            ctx.unwrap_with(region.with_node),
            applicability="unsafe",
        )
    ctx.report(
        region.item.item,
        f"autocast region nested inside another enabled autocast region (line "
        f"{ctx.line_of(outer.item.item)}): the inner one overrides the outer, so one of them is "
        "redundant or switches dtype mid-computation",
        fix,
    )


def _report_prepared(ctx, region, called: str, engine) -> None:
    from linter.context import make_fix

    scope = _scope_of(ctx.model, region)
    name = ctx.model.engine_in_scope(scope) if scope is not None else None
    name = name or engine.name
    fix = None
    if not region.via_name:  # `with ctx:`: the call is bound elsewhere and may be reused
        fix = make_fix(
            f"Use `{name}.autocast()`",
            ctx.replace(region.call, f"{name}.autocast()"),
            applicability="unsafe",
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
