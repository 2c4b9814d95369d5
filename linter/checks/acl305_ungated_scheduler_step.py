"""ACL305: a scheduler stepped on micro-steps that do not step the optimizer (variant a), or,
as a hint, straight after a GradScaler step that may have been skipped (variant b)."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.edits import move_after
from linter.model import schedules, windows
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code
from linter.model.kinds import ScalerRole, SiteKind
from linter.model.loops import Site
from linter.model.precision_runs import scaler_configuration


def check(ctx: RuleContext) -> None:
    model = ctx.model
    for loop in model.loops:
        flagged = set()
        for site in loop.of_kind(SiteKind.SCHED_STEP):
            if _per_micro_step(model, loop, site):
                flagged.add(id(site.call))
                _report_ungated(ctx, loop, site)
        for call, after in _after_scaler_step(model, loop):
            if id(call.call) not in flagged:
                _report_unchecked(ctx, call, after)


def _per_micro_step(model, loop, site) -> bool:
    """Stepped on every micro-step of a manual accumulation window. Left alone: loops without
    accumulation, `accumulate()` (a prepared scheduler is gated by the wrapper), schedulers
    stepped outside the batch loop (per epoch), metric-driven `ReduceLROnPlateau.step(metric)`,
    any scheduler under a test (a skip test, an epoch-end test), and a schedule sized in
    micro-steps on purpose (`num_training_steps=max_steps * K`, `len(dl) * epochs`), which
    stepping every micro-step matches."""
    if windows.manual_window(model, loop, site.stmt) is None:
        return False
    if model.on_update_step(loop, site.stmt) or windows.is_plateau_step(model, site):
        return False
    if any(s.unit() == "micro" for s in schedules.sized_for(model, site)):
        return False
    return windows.runs_every_iteration(loop, site.stmt)


def _report_ungated(ctx, loop, site) -> None:
    label = code(site.call.func)
    sized = [s for s in schedules.sized_for(ctx.model, site) if s.unit() == "update"]
    length = (
        f" (`{sized[0].parameter}={code(sized[0].length)}` at line {ctx.line_of(sized[0].call)} "
        "counts optimizer steps)"
        if sized
        else ""
    )
    steps = windows.update_steps(ctx.model, loop, site.stmt)
    fix = None
    if steps:
        anchor = windows.after_step(
            ctx.model, loop, steps[0], (SiteKind.SCALER_UPDATE, SiteKind.ZERO_GRAD)
        )
        edits = move_after(ctx, site.stmt, anchor)
        if edits is not None:
            fix = make_fix(f"Move `{label}()` into the update-step branch", *edits)
    ctx.report(
        site.call,
        f"`{label}()` runs on every micro-step while the optimizer steps once per window: "
        f"the schedule{length} advances K times per update (warm-up and decay run K times too "
        "fast)",
        fix,
        configuration=gate_configuration(
            ctx.model, ctx.model.gate_for(loop, site.stmt), loop.scope
        ),
    )


def _after_scaler_step(model, loop):
    """(scheduler step or EMA update, the scaler call it follows) in the same block right after
    `scaler.step()` / `scaler.update()`, with no test for a skipped step between them."""
    scaler_calls = [
        s
        for s in loop.of_kind(SiteKind.SCALER_STEP, SiteKind.SCALER_UPDATE)
        if model.scaler_role(s.receiver, s.stmt.scope) == ScalerRole.ENABLED
    ]
    if not scaler_calls:
        return
    candidates = [(s, s.stmt) for s in loop.of_kind(SiteKind.SCHED_STEP)]
    candidates += [(c, c.stmt) for c in windows.ema_updates(model, loop)]
    for call, stmt in candidates:
        if (
            isinstance(call, Site)
            and call.kind == SiteKind.SCHED_STEP
            and windows.is_plateau_step(model, call)
        ):
            continue
        before = [s for s in scaler_calls if s.stmt.order < stmt.order]
        if before and windows.same_block(before[-1].stmt, stmt):
            yield call, before[-1]


def _report_unchecked(ctx, call, after) -> None:
    label = code(call.call.func)
    ctx.report(
        call.call,
        f"hint: `{label}()` runs right after `{code(after.call.func)}()` with no test for a "
        "skipped step: when the GradScaler skips the optimizer on inf/NaN, the schedule (or "
        "average) still moves (test `scaler.get_scale()` against its value before the step)",
        severity="info",
        configuration=scaler_configuration(ctx.model, after.receiver),
    )
