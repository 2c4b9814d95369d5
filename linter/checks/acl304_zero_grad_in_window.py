"""ACL304: `zero_grad()` that wipes the micro-batches the window has gathered so far."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.edits import delete_line, movable, move_after
from linter.model import windows
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code
from linter.model.kinds import FrameKind, RegionKind, SiteKind
from linter.model.loops import same_path


def check(ctx: RuleContext) -> None:
    """Report zero_grad on every micro-step of a manual window, or before the backward inside
    `accumulate()`."""
    for loop in ctx.model.loops:
        for site in loop.of_kind(SiteKind.ZERO_GRAD):
            found = _window_it_wipes(ctx.model, loop, site)
            if found is not None:
                where, steps = found
                _report(ctx, loop, site, steps, where)


def _window_it_wipes(model, loop, site):
    """(where the call runs, the optimizer steps it belongs after) when it wipes a window."""
    if model.regions_around(site.stmt, RegionKind.ACCUMULATE):
        if _before_backward_in_accumulate(model, loop, site):
            return "at the top of the `accumulate()` block", _steps_later_in_block(loop, site)
        return None
    if windows.zeroing_micro_loop(loop, site.stmt):
        if windows.runs_every_iteration(loop, site.stmt):
            return "on every pass of the micro-step loop", windows.steps_after_micro_loop(loop)
        return None
    if _every_micro_step(model, loop, site):
        steps = windows.update_steps(model, loop, site.stmt)
        return "on every micro-step of a manual accumulation window", steps
    return None


def _every_micro_step(model, loop, site) -> bool:
    """Unconditional in a loop whose optimizer steps every K > 1 micro-steps. A zero_grad under
    any test (the step condition, a window start `if i % K == 0:`, a non-finite check) is left
    alone, as is one that runs once per update (after the step, outside a micro-step loop)."""
    if windows.manual_window(model, loop, site.stmt) is None:
        return False
    if model.on_update_step(loop, site.stmt):
        return False
    return windows.runs_every_iteration(loop, site.stmt)


def _before_backward_in_accumulate(model, loop, site) -> bool:
    """Before the backward of its own `accumulate()` block, unconditionally: on the update step
    the prepared `zero_grad` really acts. After `opt.step()` the wrapper gates it."""
    region = model.regions_around(site.stmt, RegionKind.ACCUMULATE)[-1]
    if not windows.accumulates_more_than_once(model, region.receiver):
        return False
    if any(f.kind == FrameKind.IF for f in site.stmt.frames_inside(region.with_node)):
        return False
    if _after_its_own_step(model, loop, site, region):
        return False
    later = [
        b
        for b in loop.backwards
        if b.stmt.order > site.stmt.order and any(f.node is region.with_node for f in b.stmt.frames)
    ]
    return bool(later)


def _after_its_own_step(model, loop, site, region) -> bool:
    """After a step, in the block, of the optimizer it clears: the wrapper gates it, and a
    backward after it feeds another optimizer (a GAN's `g_opt.step(); g_opt.zero_grad()`, then
    the discriminator's backward and step in the same `accumulate()` entry)."""
    return any(
        s.stmt.order < site.stmt.order
        and any(f.node is region.with_node for f in s.stmt.frames)
        and same_path(s.stmt, site.stmt)
        and model.gates.clears_what_it_steps(site, s)
        for s in loop.steps
    )


def _steps_later_in_block(loop, site):
    """The optimizer steps after the zero_grad in the same block of `accumulate()`."""
    return [
        s
        for s in loop.steps
        if s.stmt.order > site.stmt.order and windows.same_block(s.stmt, site.stmt)
    ]


def _report(ctx, loop, site, steps, where: str) -> None:
    label = code(site.call.func)
    fix, notes = None, ()
    if steps:
        step = steps[0]
        anchor = windows.after_step(ctx.model, loop, step, (SiteKind.SCALER_UPDATE,))
        edits = move_after(ctx, site.stmt, anchor)
        if _zeroed_after(loop, site, step):
            edits = [delete_line(ctx, site.stmt)] if movable(ctx, site.stmt) else None
        if edits is not None:
            fix = make_fix(f"Move `{label}()` after the optimizer step", *edits)
    else:
        notes = ("the optimizer step is not in this function: move the call after it by hand",)
    ctx.report(
        site.call,
        f"`{label}()` runs {where}: it discards the gradients of the window's earlier "
        "micro-batches, so each update sees only the last one",
        fix,
        notes=notes,
        configuration=gate_configuration(
            ctx.model, ctx.model.gate_for(loop, site.stmt), loop.scope
        ),
    )


def _zeroed_after(loop, site, step) -> bool:
    """The update branch already zeroes the same receiver after the step."""
    return any(
        z is not site
        and z.receiver == site.receiver
        and z.stmt.order > step.stmt.order
        and windows.same_block(z.stmt, step.stmt)
        for z in loop.of_kind(SiteKind.ZERO_GRAD)
    )
