"""ACL108: stepping the original optimizer or scheduler after `Accelerator.prepare` wrapped it.

The inner object's step is reached without its Accelerate wrapper, so the accumulation gating,
the scaler and the skip logic are all bypassed; reported before the step changes anything.
"""

from __future__ import annotations

from guard.checks._common import report

CODES = ("ACL108",)


def install(tracker) -> None:
    tracker.subscribe("optimizer_step_pre", _before_optimizer_step, when="prepared")
    tracker.subscribe(
        "scheduler_step_pre",
        lambda **kw: _before_scheduler_step(tracker, **kw),
        when="prepared",
    )


def _before_optimizer_step(state, via_wrapper, **_) -> None:
    if state.prepared_by is not None and via_wrapper is None:
        report(
            "ACL108",
            f"the original optimizer was stepped after prepare() ({state.backwards} backward "
            "pass(es) in this window): this skips the accumulation gate and loss scaling of the "
            "prepared optimizer; call step() on the object prepare() returned",
        )


def _before_scheduler_step(tracker, scheduler, via_wrapper, **_) -> None:
    if via_wrapper is None and scheduler in tracker.prepared_schedulers:
        report(
            "ACL108",
            f"the original scheduler was stepped after prepare() (last_epoch="
            f"{scheduler.last_epoch}): it advances on every micro-batch instead of every "
            "optimizer step; call step() on the scheduler prepare() returned",
        )
