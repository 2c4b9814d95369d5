"""ACL601: a non-finite loss or gradient about to reach the optimizer.

Each backward records `isfinite(loss)` as a device-side flag (no host sync per micro-step); at
the step the flags are read together with the total gradient norm, once, before any parameter
changes. Under a GradScaler, inf losses and gradients are the scaler's business (an overflow:
the PyTorch gradient-penalty recipe produces them on purpose, and ACL603 reports a persistent
streak), so only a NaN unscaled loss is reported there, as a warning: the scaler skips the step.
"""

from __future__ import annotations

import torch

from guard.checks._common import report

CODES = ("ACL601",)
_KEY = "ACL601"


def install(tracker) -> None:
    tracker.subscribe("scale", _after_scale)
    tracker.subscribe("backward", _after_backward)
    tracker.subscribe("scaler_step_pre", lambda state, **_: _check(state, scaled=True))
    tracker.subscribe("optimizer_step_pre", _before_step)
    tracker.subscribe("zero_grad", _after_zero_grad)


def _finite(t: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(t.detach()).all()


def _after_scale(outputs, scaled, **_) -> None:
    if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
        scaled._guard_loss_finite = ~torch.isnan(outputs.detach()).any()


def _after_backward(tensors, states, **_) -> None:
    if not states or not tensors:
        return
    root = tensors[0]
    flag = getattr(root, "_guard_loss_finite", None)
    if flag is None:
        flag = _finite(root)
    for st in states:
        st.extra.setdefault(_KEY, []).append(flag)


def _after_zero_grad(states, **_) -> None:
    for st in states:
        st.extra.pop(_KEY, None)


def _before_step(state, in_scaler_step, **_) -> None:
    if in_scaler_step:
        return  # checked at scaler_step_pre, where the scaler's own inf check follows
    _check(state, scaled=state.scaled_pending)


def _check(state, scaled: bool) -> None:
    flags = state.extra.pop(_KEY, [])
    optimizer = state.optimizer
    norm = _grad_norm(optimizer) if not scaled and optimizer is not None else None
    checks = flags + ([torch.isfinite(norm)] if norm is not None else [])
    if not checks or bool(torch.stack([c.to(checks[0].device) for c in checks]).all()):
        return
    bad_losses = sum(1 for f in flags if not bool(f))
    if scaled:
        report(
            "ACL601",
            f"{bad_losses} of {len(flags)} loss(es) since the last step were NaN before loss "
            "scaling: that is a bug in the loss, not an fp16 overflow (the scaler will skip the "
            "step); find the source with torch.autograd.detect_anomaly()",
            "warning",
        )
        return
    if bad_losses:
        what = f"{bad_losses} of {len(flags)} loss(es) since the last step were inf/NaN"
    else:
        what = f"the total gradient norm is {float(norm)}"
    report(
        "ACL601",
        f"{what}: this step would write inf/NaN into every weight it updates; find the source "
        "(torch.autograd.detect_anomaly()), skip such batches, or clip with "
        "error_if_nonfinite=True",
    )


def _grad_norm(optimizer) -> torch.Tensor | None:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return None
    return torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False)
