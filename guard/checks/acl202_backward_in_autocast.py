"""ACL202: a backward pass started while autocast is enabled for the loss's device."""

from __future__ import annotations

import functools

import torch

from guard import _report
from guard.checks._common import report

CODES = ("ACL202",)


def install(tracker) -> None:
    # partial, not a lambda: one Python frame less on every backward
    tracker.subscribe("backward_pre", functools.partial(_before_backward, tracker), when="autocast")


def _before_backward(tracker, tensors, via, **_) -> None:
    if not tracker.autocast_stack or via == "engine" or not tensors:
        return  # fast path: no autocast region is open
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return
    region = next((f for f in reversed(tracker.autocast_stack) if f.enabled), None)
    where = f" entered at {region.location}" if region is not None and region.location else ""
    report(
        "ACL202",
        f"backward runs inside the {torch.get_autocast_dtype(device)} autocast region{where}: "
        "compiled backward and custom autograd functions then run in low precision; end the "
        "autocast block before calling backward",
        "warning",
    )


def engine_backward(device_type: str) -> None:
    """The engine's case: engine.backward called inside an enabled autocast region."""
    if torch.is_autocast_enabled(device_type) and _report.enabled("ACL202"):
        report(
            "ACL202",
            "engine.backward runs inside an autocast region: only the forward belongs there "
            "(a compiled backward can inherit fp16); call backward after the `with` block",
        )
