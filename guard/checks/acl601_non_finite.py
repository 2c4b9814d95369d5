"""ACL601: a non-finite loss or gradient about to reach the optimizer.

At each real step, before any parameter changes, the total gradient norm is checked once (one host
sync per step, nothing per micro-step); when the window was clipped, the norm the clip computed is
reused. Without a scaler, each backward also keeps a detached reference to its loss (no kernel per
micro-step); at the step one `isfinite` over all of them is read together with the norm: a NaN loss
can leave finite gradients (a detached NaN term), which the norm alone misses.
Under a GradScaler, inf gradients are the scaler's business (an overflow: the PyTorch
gradient-penalty recipe produces them on purpose, and ACL603 reports a persistent streak), so
there only a NaN loss before scaling is reported, as a warning, since the scaler will skip the
step. That flag is recorded on the device at `scale()` and read at the step.

Option `guard.configure(nonfinite_policy="skip")` (default "raise"): instead of an error, warn,
clear the optimizer's gradients and let the step run without them, so no parameter changes.
"""

from __future__ import annotations

import torch

from guard import _report
from guard.checks._common import report

CODES = ("ACL601",)
OPTIONS = {"nonfinite_policy": "raise"}
_LOSSES, _NORM = "ACL601.losses", "ACL601.norm"
_RAW_LOSSES = "ACL601.raw_losses"  # detached unscaled losses since the last step


def install(tracker) -> None:
    tracker.subscribe("scale", _after_scale)
    tracker.subscribe("backward", _after_backward)
    tracker.subscribe("clip_done", _after_clip)
    tracker.subscribe("scaler_step_pre", _before_scaler_step)
    tracker.subscribe("optimizer_step_pre", _before_step)
    tracker.subscribe("zero_grad", _after_zero_grad)


def _after_scale(outputs, scaled, **_) -> None:
    if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
        scaled._guard_loss_not_nan = ~torch.isnan(outputs.detach()).any()


def _after_backward(tensors, scaled_by, states, **_) -> None:
    flag = getattr(tensors[0], "_guard_loss_not_nan", None) if tensors else None
    raw = [t.detach() for t in tensors if t.is_floating_point()] if scaled_by is None else []
    for st in states:
        st.extra.pop(_NORM, None)  # a clip's norm is stale once more gradient arrives
        if flag is not None:
            st.extra.setdefault(_LOSSES, []).append(flag)
        if raw:
            st.extra.setdefault(_RAW_LOSSES, []).extend(raw)


def _all_finite(losses: list[torch.Tensor] | None) -> torch.Tensor | None:
    """One device-side bool for every loss of the window (three kernels per step, no host sync)."""
    if not losses:
        return None
    return torch.isfinite(torch.cat([loss.reshape(-1).float() for loss in losses])).all()


def _after_clip(kind, states, result, **_) -> None:
    if kind == "norm" and isinstance(result, torch.Tensor):
        for st in states:
            st.extra[_NORM] = result


def _after_zero_grad(states, **_) -> None:
    for st in states:
        for key in (_LOSSES, _NORM, _RAW_LOSSES):
            st.extra.pop(key, None)


def _before_scaler_step(state, **_) -> None:
    flags = state.extra.pop(_LOSSES, [])
    state.extra.pop(_NORM, None)
    state.extra.pop(_RAW_LOSSES, None)
    if flags and not bool(torch.stack(flags).all()):
        bad = sum(1 for f in flags if not bool(f))
        report(
            "ACL601",
            f"{bad} of {len(flags)} loss(es) since the last step were NaN before loss scaling: "
            "that is a bug in the loss, not an fp16 overflow (the scaler will skip the step); "
            "find the source with torch.autograd.detect_anomaly()",
            "warning",
        )


def _before_step(optimizer, state, in_scaler_step, **_) -> None:
    losses = state.extra.pop(_RAW_LOSSES, None)
    if in_scaler_step or state.scaled_pending:
        return  # the scaler's inf check runs (or ACL102 reports the bypass)
    loss_finite = _all_finite(losses)
    norm = state.extra.pop(_NORM, None)
    if norm is None:
        norm = _grad_norm(optimizer)
    what = _problem(norm, loss_finite)
    if what is None:
        return
    if _report.option("nonfinite_policy", OPTIONS["nonfinite_policy"]) == "skip":
        _clear_gradients(optimizer)
        report("ACL601", f"{what}: gradients cleared, this step changes nothing", "warning")
        return
    report(
        "ACL601",
        f"{what}: this step would write inf/NaN into every weight it updates; find the source "
        "(torch.autograd.detect_anomaly()), skip such batches, or clip with "
        "error_if_nonfinite=True",
    )


def _problem(norm, loss_finite) -> str | None:
    """What is non-finite, from one host read of the combined flags; None when all is finite."""
    flags = [
        f for f in (None if norm is None else torch.isfinite(norm), loss_finite) if f is not None
    ]
    if not flags or bool(flags[0] if len(flags) == 1 else flags[0] & flags[1]):
        return None
    grads = "" if norm is None else f"the total gradient norm is {float(norm)}"
    if loss_finite is None or bool(loss_finite):
        return f"{grads} (a non-finite loss or gradient)"
    loss = "a loss passed to backward since the last step was inf/NaN"
    return f"{loss} and {grads}" if grads and not bool(torch.isfinite(norm)) else loss


def _clear_gradients(optimizer) -> None:
    """Optimizers skip parameters whose grad is None, so the step that follows is a no-op."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


def _grad_norm(optimizer) -> torch.Tensor | None:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return None
    return torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False)
