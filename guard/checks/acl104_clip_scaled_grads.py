"""ACL104: clipping gradients that still carry the loss scale S (no `unscale_` first)."""

from __future__ import annotations

from guard.checks._common import report, scale_of

CODES = ("ACL104",)


def install(tracker) -> None:
    tracker.subscribe("clip", _before_clip)


def _before_clip(kind, states, **_) -> None:
    for st in states:
        if not st.scaled_pending or st.unscaled or st.scaler is None:
            continue
        scale = scale_of(st.scaler)
        effect = (
            f"the norm it compares with max_norm (and returns) is {scale}x too large, so the step "
            f"is clipped to about max_norm/{scale}"
            if kind == "norm"
            else f"clip_value is applied to gradients {scale}x too large"
        )
        report(
            "ACL104",
            f"clip_grad_{kind}_ on scaled gradients: {effect}; call scaler.unscale_(opt) before "
            "clipping (or accelerator.clip_grad_norm_ under Accelerate)",
        )
        return
