"""ACL106: a backward through an fp16 autocast forward with no GradScaler.

Gradients below fp16's smallest subnormal (about 6e-8) flush to zero without any error. The
check looks at the autocast regions entered with gradients enabled since the previous backward.
"""

from __future__ import annotations

import torch

from guard.checks._common import report

CODES = ("ACL106",)


def install(tracker) -> None:
    tracker.subscribe("backward_pre", lambda **kw: _before_backward(tracker, **kw))


def _before_backward(tracker, scaled_by, via, **_) -> None:
    if not tracker.regions_since_backward or scaled_by is not None or via == "engine":
        return
    fp16 = [f for f in tracker.regions_since_backward if f.dtype == torch.float16]
    if not fp16:
        return
    report(
        "ACL106",
        f"backward of a loss whose forward ran under fp16 autocast ({fp16[0].location}) without "
        "a GradScaler: gradients below ~6e-8 become zero; use dtype=torch.bfloat16, or keep "
        "fp16 and use scaler.scale(loss).backward() with scaler.step/update",
        "warning",
    )
