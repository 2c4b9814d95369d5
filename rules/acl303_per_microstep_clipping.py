"""ACL303 per-microstep-clipping: clipping or unscaling on micro-steps that do not step."""

from rules._base import Rule

RULE = Rule(
    code="ACL303",
    name="per-microstep-clipping",
    summary="gradient clipping or unscaling runs on every micro-step instead of only before the "
    "optimizer step",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags a clip or unscale call (`accelerator.clip_grad_norm_` / `clip_grad_value_`,
`torch.nn.utils.clip_grad_*`, `fabric.clip_gradients`, `scaler.unscale_`,
`accelerator.unscale_gradients`) inside
`with accelerator.accumulate(...)` that is not guarded by `if accelerator.sync_gradients` (or the
engine's equivalent), or in a manual accumulation loop outside the condition that gates
`opt.step()`. A gate may also be a name bound to the condition (`sync =
accelerator.sync_gradients`) or a conditional expression (`clip(...) if
accelerator.sync_gradients else None`). A per-batch function (`train_step`) is judged by the
step gate of the loop that calls it. A condition on another cadence (`step % logging_steps == 0`)
is not a gate: only a modulus that is the accumulation value counts.

## Why is this bad?
On a micro-step that does not step, `.grad` holds a partial sum. In fp16 every clip needs an
unscale, and a second `unscale_` before `update()` raises `RuntimeError`, so the run crashes on
the second micro-step. In bf16/fp32 the partial sums are clipped, and since clipping is not linear
(clip(a) + b differs from clip(a + b)) the final gradient is silently wrong. Under FSDP/XLA every
extra clip also costs a norm reduction.

## Example
```python
with accelerator.accumulate(model):
    accelerator.backward(model(**batch).loss)
    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
    opt.step(); opt.zero_grad()
```

## Use instead
```python
with accelerator.accumulate(model):
    accelerator.backward(model(**batch).loss)
    if accelerator.sync_gradients:
        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
    opt.step(); opt.zero_grad()
```

## Fix safety
Safe. The statement is wrapped in `if accelerator.sync_gradients:` (Accelerate / engine) or in the
loop's step condition (manual loops, only when that condition has no side effects and can be
evaluated twice). No fix when the statement binds a name, such as `grad_norm = ...`, that is read
outside the new block.

## At runtime
`engine.clip_grad_norm_`, the patched torch clip functions and `scaler.unscale_` check the engine's
micro-step counter; a call on a non-sync micro-step raises ACL303 before torch's second-unscale
error can occur.
""",
)


def check(ctx) -> None:
    """Report clip/unscale calls that run on micro-steps where the optimizer does not step."""
    model = ctx.model
    for loop in model.loops:
        found = []
        for site in loop.of_kind("clip", "unscale"):
            if model.on_update_step(loop, site.stmt, site.call):
                continue
            regions = model.regions_around(site.stmt, "accumulate")
            if regions and _accumulates_once(model, regions[-1].receiver):
                continue
            if regions:
                receiver = regions[-1].receiver or "accelerator"
                found.append((site, f"{receiver}.sync_gradients", f"`{receiver}.accumulate`"))
            else:
                gate = model.gate_for(loop, site.stmt)
                if _gated_manually(gate, site):
                    found.append((site, _condition(gate), "a manual accumulation loop"))
        for run in _runs(found):
            _report_run(ctx, run)


def _accumulates_once(model, receiver) -> bool:
    """An engine built with a literal `gradient_accumulation_steps=1`: every step syncs."""
    from linter.model.cst_util import int_value

    engine = model.setup.engines.get(receiver or "")
    value = int_value(engine.accum) if engine is not None else None
    return value is not None and value <= 1


def _runs(found):
    """Group adjacent flagged statements of one block: one `if` then covers them all."""
    runs = []
    for item in found:
        site, condition, _ = item
        if runs:
            previous, previous_condition, _ = runs[-1][-1]
            adjacent = site.stmt.order == previous.stmt.order + 1
            same_block = [id(f.node) for f in site.stmt.frames] == [
                id(f.node) for f in previous.stmt.frames
            ]
            if adjacent and same_block and condition == previous_condition:
                runs[-1].append(item)
                continue
        runs.append([item])
    return runs


def _gated_manually(gate, site) -> bool:
    from linter.model.cst_util import int_value

    if gate is None or gate.kind == "accumulate":
        return False
    if int_value(gate.k) is not None and int_value(gate.k) <= 1:
        return False
    if gate.kind == "micro-loop":
        return any(f.node is gate.node for f in site.stmt.frames)
    return True


def _condition(gate) -> str | None:
    """The step condition as text, when it can be repeated without side effects."""
    import libcst as cst

    from linter.model.cst_util import code, dotted, walk

    if gate.test is None or gate.caller is not None:
        return None  # a caller's condition reads names this function does not have
    for node in walk(gate.test):
        if isinstance(node, cst.Call) and dotted(node.func) != "len":
            return None
        if isinstance(node, (cst.NamedExpr, cst.Await, cst.Yield, cst.Lambda)):
            return None
    text = code(gate.test)
    return text if gate.holds else f"not ({text})"


def _report_run(ctx, run) -> None:
    from linter.context import make_fix

    condition = run[0][1]
    fix = None
    if condition is not None and not any(_binds_name_read_elsewhere(s.stmt) for s, _, _ in run):
        edit = ctx.wrap_in_if([s.stmt.line for s, _, _ in run], condition)
        fix = make_fix(f"Run it only when `{condition}`", edit)
    for site, _, where in run:
        _report(ctx, site, condition, where, fix)


def _report(ctx, site, condition: str | None, where: str, fix) -> None:
    from linter.model.cst_util import code

    name = site.call.func
    label = code(name.attr if hasattr(name, "attr") else name)
    hint = f"gate it on `{condition}`" if condition else "move it to the optimizer-step branch"
    ctx.report(
        site.call,
        f"`{label}` runs on every micro-step in {where}, not only when the optimizer steps: "
        f"it clips/unscales partial gradient sums ({hint})",
        fix,
    )


def _binds_name_read_elsewhere(stmt) -> bool:
    import libcst as cst

    from linter.model.cst_util import walk

    node = stmt.node
    targets = []
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
        targets = [node.target]
    names = {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}
    return any(stmt.scope.reads_elsewhere(name, stmt) for name in names)
