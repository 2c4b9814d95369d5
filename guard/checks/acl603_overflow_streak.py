"""ACL603: a GradScaler that keeps skipping steps (every step overflows) or whose scale collapsed.

A step counts as skipped when the scale backs off at `update()`, which also catches fused
optimizers that skip inside the kernel, or when the scaler's own found-inf record (private state,
read by the tracker between `step` and `update`) is non-zero, which also covers an explicit
`update(new_scale)`. Option: `guard.configure(overflow_streak=N)`.
"""

from __future__ import annotations

from guard import _report
from guard.checks._common import report

CODES = ("ACL603",)
OPTIONS = {"overflow_streak": 20}


def install(tracker) -> None:
    tracker.subscribe("update", _after_update)


def _after_update(sstate, skipped, scale_after, **_) -> None:
    if not skipped:
        return
    streak = int(_report.option("overflow_streak", OPTIONS["overflow_streak"]))
    if sstate.consecutive_skips >= streak or scale_after < 1:
        report(
            "ACL603",
            f"{sstate.consecutive_skips} optimizer steps in a row were skipped for inf/NaN "
            f"gradients and the loss scale is now {scale_after:g}: the weights stopped changing "
            "while the loop goes on; look for a loss or layer that overflows at any scale",
        )
