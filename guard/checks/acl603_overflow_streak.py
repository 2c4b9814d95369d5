"""ACL603: a GradScaler that keeps skipping steps (every step overflows) or whose scale collapsed.

A step counts as skipped when the scale backs off at `update()`, which also catches fused
optimizers that skip inside the kernel, or when the scaler's own found-inf record (private state,
read by the tracker between `step` and `update`) is non-zero, which also covers an explicit
`update(new_scale)`. Option: `guard.configure(overflow_streak=N)`.
"""

from __future__ import annotations

from typing import Any

from guard import _report
from guard.checks._common import report

CODES = ("ACL603",)
OPTIONS = {"overflow_streak": 20}


def install(tracker) -> None:
    tracker.subscribe("update", _after_update)


def _after_update(sstate, skipped, scale_after, **_) -> None:
    if skipped:
        judge(sstate.consecutive_skips, scale_after)


def judge(consecutive: int, scale: float) -> None:
    """After a skipped step: `consecutive` skipped in a row, the scale now `scale` (the
    tracker's update and the engine's own steps ask the same question)."""
    streak = int(_report.option("overflow_streak", OPTIONS["overflow_streak"]))
    if consecutive >= streak or scale < 1:
        report(
            "ACL603",
            f"{consecutive} optimizer steps in a row were skipped for inf/NaN "
            f"gradients and the loss scale is now {scale:g}: the weights stopped changing "
            "while the loop goes on; look for a loss or layer that overflows at any scale",
        )


class EngineStreak:
    """The engine's own count of its skipped steps, kept while the guard is not installed
    (installed, the tracker's `update` event covers them)."""

    def __init__(self) -> None:
        self.consecutive = 0

    def after_step(self, skipped: bool, scaler: Any) -> None:
        if not skipped:
            self.consecutive = 0
            return
        self.consecutive += 1
        judge(self.consecutive, scaler.get_scale())
