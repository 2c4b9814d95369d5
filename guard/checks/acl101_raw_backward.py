"""ACL101: a backward pass that skips the loss scaling or 1/K division its loop relies on.

Accelerate or guard.Engine: a raw `loss.backward()` reaching a prepared optimizer whose owner
divides by K or scales the loss. Plain AMP loops: at the first `unscale_`/`step` of a window,
backward passes that reached the optimizer without `scaler.scale()` (reported before torch's
`_scale is None` assertion, or before their gradients are divided by S and vanish).
"""

from __future__ import annotations

from guard import _private
from guard.checks._common import report

CODES = ("ACL101",)


def install(tracker) -> None:
    tracker.subscribe("backward", _after_backward, when="prepared")
    tracker.subscribe("unscale_pre", _before_unscale_or_step)
    tracker.subscribe("scaler_step_pre", _before_unscale_or_step)


def _after_backward(via, states, **_) -> None:
    if via != "raw":
        return
    for st in states:
        accelerator = st.prepared_by
        if accelerator is None:
            continue
        n = getattr(accelerator, "gradient_accumulation_steps", 1)
        skipped = [f"the 1/{n} division"] if n > 1 else []
        if getattr(accelerator, "scaler", None) is not None:
            skipped.append("loss scaling")
        if skipped:
            owner = type(accelerator).__name__
            report(
                "ACL101",
                f"loss.backward() on a model prepared by an {owner} skips "
                + " and ".join(skipped)
                + f"; call {owner.lower()}.backward(loss) instead",
            )


def _before_unscale_or_step(scaler, optimizer, state, **_) -> None:
    if state.unscaled:  # already checked at this window's unscale_
        return
    owner = state.prepared_by
    fix = (
        f"call {type(owner).__name__.lower()}.backward(loss) for every pass"
        if owner is not None
        else "use scaler.scale(loss).backward() for every pass"
    )
    never_scaled = _private.scaler_scale_missing(scaler, "ACL101's never-scaled check")
    unscaled = state.contrib_backwards - state.contrib_scaled
    if never_scaled:
        report(
            "ACL101",
            f"scaler.scale() was never called, yet {state.contrib_backwards} backward pass(es) "
            "reached this optimizer and the scaler now steps it (torch would fail on "
            f"'_scale is None'); {fix}",
        )
    elif unscaled > 0 and state.scaled_pending:
        report(
            "ACL101",
            f"{unscaled} of {state.contrib_backwards} backward passes since the last step did not "
            "go through scaler.scale(): unscale_ will divide their gradients by the loss scale "
            f"and they will effectively vanish; {fix}",
        )
