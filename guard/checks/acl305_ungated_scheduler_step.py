"""ACL305: a scheduler step with no real optimizer step since the scheduler's previous step.

Real means the inner `step()` ran and the GradScaler did not back off at the following
`update()` (a fused optimizer's skip happens inside the kernel, so the back-off is what shows it).
Prepared schedulers are left alone: their wrapper gates them (and steps them W times per optimizer
step under DDP), and ACL603 covers the skips it misses.

With no step attempted since the scheduler's last step, the schedule runs ahead: an error. When
the one step attempted since was skipped by the GradScaler, stepping the scheduler anyway is the
catalogue's second variant, a warning (the schedule moves one step ahead of the weights). When
several attempts were all skipped, the scheduler's cadence is coarser than the optimizer's (an
epoch-level scheduler while the fp16 scale calibrates, as in YOLOv5's first epoch): silent.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from guard.checks._common import report

CODES = ("ACL305",)


@dataclass
class Steps:
    """An optimizer's steps as ACL305 counts them (`OptState.of`)."""

    real: int = 0  # ran and were not skipped by the GradScaler
    tried: int = 0  # attempted, run or skipped


def install(tracker) -> None:
    seen_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheduler -> (real, tried)
    ran_in_scaler_step: list = []

    def before_step(state, in_scaler_step, **_) -> None:
        if not in_scaler_step:  # scaler.step counts its attempt itself, run or skipped
            state.of(Steps).tried += 1

    def after_step(state, **_) -> None:
        state.of(Steps).real += 1

    def after_scaler_step(state, ran, **_) -> None:
        state.of(Steps).tried += 1
        if ran:
            ran_in_scaler_step.append(state)

    def after_update(skipped, **_) -> None:
        if skipped:  # the step(s) since the last update were skipped inside the kernel
            for st in ran_in_scaler_step:
                st.of(Steps).real -= 1
        ran_in_scaler_step.clear()

    def before_scheduler_step(scheduler, state, via_wrapper, **_) -> None:
        if state is None or via_wrapper is not None or tracker.prepared_schedulers.get(scheduler):
            return
        steps = state.of(Steps)
        real, tried = steps.real, steps.tried
        previous = seen_at.get(scheduler)
        seen_at[scheduler] = (real, tried)
        real_before, tried_before = previous if previous is not None else (0, 0)
        if real != real_before or tried - tried_before >= 2:
            return
        _report(scheduler, state, previous is None, skipped=tried > tried_before)

    tracker.subscribe("optimizer_step_pre", before_step)
    tracker.subscribe("optimizer_step", after_step)
    tracker.subscribe("scaler_step", after_scaler_step)
    tracker.subscribe("update", after_update)
    tracker.subscribe("scheduler_step_pre", before_scheduler_step)


def _report(scheduler, state, first: bool, skipped: bool) -> None:
    """An error when no step was attempted; a warning when the one attempt was a scaler skip."""
    since = "before the optimizer's first real step" if first else "again"
    what = (
        "the only optimizer step since its last step was skipped by the GradScaler"
        if skipped
        else "no optimizer step since its last step"
    )
    report(
        "ACL305",
        f"{type(scheduler).__name__}.step() runs {since} with {what} ({state.backwards} "
        f"micro-batch(es) accumulated, {state.steps} optimizer steps so far, "
        f"{state.skipped_steps} skipped by the GradScaler): the schedule advances faster than "
        "training; step the scheduler in the branch that steps the optimizer (and not after a "
        "skipped fp16 step)",
        "warning" if skipped else "error",
    )
