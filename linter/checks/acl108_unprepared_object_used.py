"""ACL108: the original optimizer or scheduler stepped after `prepare` returned a wrapper, and a
scheduler that never went through `prepare` stepped inside `accumulate()` with K > 1."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.model import prepared_objects
from linter.model.cst_util import code


def check(ctx: RuleContext) -> None:
    model = ctx.model
    for use in prepared_objects.original_uses(model):
        _report_original(ctx, use)
    for step in prepared_objects.unprepared_scheduler_steps(model):
        _report_unprepared(ctx, step)


def _report_original(ctx, use) -> None:
    rebinding = use.rebinding
    prepared = rebinding.prepared
    first, *others = use.calls
    fix = None
    if use.fixable:
        targets = [expr for expr, _ in use.arguments] or [c.call.func.value for c in use.calls]
        edits = [ctx.replace(node, prepared.name) for node in targets]
        fix = make_fix(f"Use the prepared `{prepared.name}`", *edits)
    ctx.report(first.call, _original_message(ctx, use, first, others), fix)


def _original_message(ctx, use, first, others) -> str:
    rebinding = use.rebinding
    prepared = rebinding.prepared
    line = ctx.line_of(rebinding.stmt.node)
    subject = f"`{first.receiver}.{first.method}()` calls the original {rebinding.role}"
    if use.through_parameter:
        lines = ", ".join(str(ctx.line_of(s.node)) for _, s in use.arguments)
        subject += f" (passed as `{prepared.original}` on line {lines})"
    subject += f", not `{prepared.name}` that `{prepared.engine}.prepare` returned on line {line}"
    if others:
        calls = ", ".join(
            f"`{c.receiver}.{c.method}()` on line {ctx.line_of(c.call)}" for c in others
        )
        subject += f" (also {calls})"
    hint = "" if use.fixable else f"; call it on `{prepared.name}` instead"
    return f"{subject}: {_effect(rebinding.role, use.calls)}{hint}"


def _effect(role: str, calls) -> str:
    if role == "scheduler":
        return "the schedule advances on every micro-batch instead of once per optimizer step"
    if all(c.method == "zero_grad" for c in calls):
        return "it zeroes the gradients on every micro-batch, so nothing accumulates"
    return (
        "the optimizer updates on every micro-batch from a partial gradient sum instead of on "
        "update steps (and in fp16 skips the loss scaler's unscale and inf check)"
    )


def _report_unprepared(ctx, step) -> None:
    site = step.site
    label = code(site.call.func)
    engine = step.engine or "the engine"
    ctx.report(
        site.call,
        f"`{label}()` runs inside `{engine}.accumulate()` with gradient accumulation, but "
        f"`{site.receiver}` never went through `{engine}.prepare`: it steps on every micro-batch, "
        f"so the schedule runs K times too fast (step it under `if {engine}.sync_gradients:`, "
        "or prepare it and check the schedule length, ACL310)",
    )
