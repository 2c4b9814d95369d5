"""ACL305: a scheduler step with no real optimizer step since the scheduler's previous step.

Real means the inner `step()` ran and the GradScaler did not back off at the following
`update()` (a fused optimizer's skip happens inside the kernel, so the back-off is what shows it).
Prepared schedulers are left alone: their wrapper gates them (and steps them W times per optimizer
step under DDP), and ACL603 covers the skips it misses.
"""

from __future__ import annotations

import weakref

from guard.checks._common import report

CODES = ("ACL305",)
_REAL = "ACL305_real_steps"


def install(tracker) -> None:
    seen_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheduler -> real steps
    ran_in_scaler_step: list = []

    def after_step(state, **_) -> None:
        state.extra[_REAL] = state.extra.get(_REAL, 0) + 1

    def after_scaler_step(state, ran, **_) -> None:
        if ran:
            ran_in_scaler_step.append(state)

    def after_update(skipped, **_) -> None:
        if skipped:  # the step(s) since the last update were skipped inside the kernel
            for st in ran_in_scaler_step:
                st.extra[_REAL] = st.extra.get(_REAL, 0) - 1
        ran_in_scaler_step.clear()

    def before_scheduler_step(scheduler, state, via_wrapper, **_) -> None:
        if state is None or via_wrapper is not None or tracker.prepared_schedulers.get(scheduler):
            return
        real = state.extra.get(_REAL, 0)
        previous = seen_at.get(scheduler)
        seen_at[scheduler] = real
        if real == (previous if previous is not None else 0):
            _report(scheduler, state, previous is None)

    tracker.subscribe("optimizer_step", after_step)
    tracker.subscribe("scaler_step", after_scaler_step)
    tracker.subscribe("update", after_update)
    tracker.subscribe("scheduler_step_pre", before_scheduler_step)


def _report(scheduler, state, first: bool) -> None:
    since = "before the optimizer's first real step" if first else "again"
    skipped = (
        f"; {state.skipped_steps} optimizer step(s) were skipped by the GradScaler"
        if state.skipped_steps
        else ""
    )
    report(
        "ACL305",
        f"{type(scheduler).__name__}.step() runs {since} with no optimizer step since its last "
        f"step ({state.backwards} micro-batch(es) accumulated, {state.steps} optimizer steps so "
        f"far{skipped}): the schedule advances faster than training; step the scheduler in the "
        "branch that steps the optimizer (and not after a skipped fp16 step)",
    )
