"""ACL102: `optimizer.step()` applied to gradients that still carry the loss scale S.

The optimizer's step pre-hook sees a scaled backward pending while no `scaler.step` is running,
so it reports before any parameter changes.
"""

from __future__ import annotations

from guard.checks._common import report, scale_of

CODES = ("ACL102",)


def install(tracker) -> None:
    tracker.subscribe("optimizer_step_pre", _before_step, when="scaled")


def _before_step(state, in_scaler_step, **_) -> None:
    if in_scaler_step or not state.scaled_pending or state.scaler is None:
        return
    if state.unscaled:
        what = (
            "gradients were unscaled, but stepping outside scaler.step() skips its inf/NaN "
            "check and the scale never adapts"
        )
    else:
        what = (
            f"the gradients of {state.scaled_backwards} scaled backward pass(es) are still "
            f"multiplied by the loss scale {scale_of(state.scaler)}, so this update is that "
            "many times too large"
        )
    report(
        "ACL102",
        f"optimizer.step() bypasses the GradScaler: {what}; call scaler.step(opt) "
        "then scaler.update()",
    )
