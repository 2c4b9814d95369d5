"""ACL405: a DDP model whose gradients are not all-reduced on the steps that count."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.model import distributed as dist
from linter.model.cst_util import code


def check(ctx: RuleContext) -> None:
    model = ctx.model
    for loop in model.loops:
        _forward_through_module(ctx, loop)
        _stuck_sync_flag(ctx, loop)
        _no_sync_around_step(ctx, loop)


def _forward_through_module(ctx, loop) -> None:
    """`model.module(x)` on the loss's path: the unwrapped module runs without DDP's hooks.
    `model.module` for saving, attributes or evaluation never reaches a backward."""
    model = ctx.model
    calls = dist.loop_calls(model, loop)
    on_path = set()
    for site in loop.backwards:
        flow = model.flow(site)
        on_path.add(id(site.stmt))
        if flow is not None:
            on_path.update(id(stmt) for _, stmt in flow.steps)
    for held in dist.ddp_models(model):
        for call in dist.module_calls(model, held, calls):
            if id(call.stmt) in on_path:
                _report_module_call(ctx, call, held)


def _report_module_call(ctx, call, held) -> None:
    func = code(call.call.func)
    owner = func.removesuffix(".forward").removesuffix(".module")
    fix = make_fix(f"Call `{owner}(...)`, the DDP wrapper", ctx.replace(call.call.func, owner))
    ctx.report(
        call.call,
        f"`{func}(...)` runs the module inside the DDP wrapper `{owner}` (line "
        f"{ctx.line_of(held.call)}) and bypasses its hooks: this loss's gradients are never "
        "all-reduced, so the replicas silently diverge",
        fix,
    )


def _stuck_sync_flag(ctx, loop) -> None:
    """`require_backward_grad_sync` toggles that stay False on the micro-step that steps."""
    toggles: dict[int, list] = {}
    for d, held in dist.sync_toggles(ctx.model, loop):
        toggles.setdefault(id(held), []).append(d)
    for defs in toggles.values():
        if all(dist.never_true_on_step(ctx.model, loop, d.value) for d in defs):
            d = defs[0]
            ctx.report(
                d.value,
                f"`{d.target} = {code(d.value)}` is False on every micro-step that steps the "
                "optimizer: DDP never all-reduces the accumulated gradients and the replicas "
                "diverge",
                notes=("make it True on the last micro-step of each window",),
            )


def _no_sync_around_step(ctx, loop) -> None:
    """An unconditional `with model.no_sync():` that also holds the optimizer step."""
    regions = [r for r in dist.no_sync_regions(ctx.model, loop.scope) if not r.conditional]
    seen: set[int] = set()
    for step in dist.step_sites(loop):
        for region in regions:
            inside = any(f.node is region.with_node for f in step.stmt.frames)
            if inside and id(region.with_node) not in seen:
                seen.add(id(region.with_node))
                line = ctx.line_of(region.bound.stmt.line) if region.bound else 0
                ctx.report(
                    region.where,
                    f"{region.spelled(line)} also covers the optimizer step at line "
                    f"{ctx.line_of(step.call)}: the window's gradients are never all-reduced "
                    "before the update, so the replicas diverge",
                    notes=("leave the micro-step that steps outside `no_sync()`",),
                )
