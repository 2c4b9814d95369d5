"""ACL105: a GradScaler on a bf16 run (loss computed under bf16 autocast, or bf16 parameters).

bf16 has fp32's exponent range, so scaling buys nothing and only adds skipped steps and syncs.
"""

from __future__ import annotations

import torch

from guard.checks._common import report, trainable_dtypes

CODES = ("ACL105",)


def install(tracker) -> None:
    tracker.subscribe("scale", lambda **_: _after_scale(tracker))
    tracker.subscribe("unscale_pre", _before_unscale_or_step)
    tracker.subscribe("scaler_step_pre", _before_unscale_or_step)


def _after_scale(tracker) -> None:
    dtypes = {frame.dtype for frame in tracker.regions_since_backward}
    if torch.bfloat16 in dtypes and torch.float16 not in dtypes:
        bf16 = next(f for f in tracker.regions_since_backward if f.dtype == torch.bfloat16)
        report(
            "ACL105",
            f"scaler.scale() on a loss whose forward ran under bf16 autocast ({bf16.location}): "
            "bf16 does not underflow, so the scaler only adds inf checks and skipped steps; "
            "drop the GradScaler for bf16 (or use dtype=torch.float16)",
            "warning",
        )


def _before_unscale_or_step(optimizer, state, **_) -> None:
    if state.unscaled or torch.bfloat16 not in trainable_dtypes(optimizer):
        return
    report(
        "ACL105",
        "the GradScaler is unscaling bf16 parameters' gradients: loss scaling is pointless for "
        "bf16 and the unscale kernel may not support BFloat16; remove the scaler",
        "warning",
    )


def scaler_outside_fp16(precision: str) -> None:
    """The engine's case: a GradScaler handed to an engine that does not train in fp16."""
    if precision == "bf16":
        report(
            "ACL105",
            "a GradScaler was passed to a bf16 engine: bf16 has fp32's exponent range, so "
            "scaling buys nothing and would hide genuine inf steps; the engine builds no scaler",
        )
    raise ValueError(f"a GradScaler belongs to mixed_precision='fp16', not {precision!r}")
