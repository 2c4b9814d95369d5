"""ACL602: an Accelerator that reports fp16/bf16 but trains in fp32.

`Accelerator(cpu=True, mixed_precision="fp16")` keeps `mixed_precision == "fp16"` while
`native_amp` is False: no scaler, no autocast. Checked at `prepare` and reported once per
Accelerator (the HF Trainer prepares its loader and its model in two calls: one mistake, one
finding, which `_report` places at the user's frame when a framework made the calls).
"""

from __future__ import annotations

import weakref

import torch

from guard.checks._common import report

CODES = ("ACL602",)


def install(tracker) -> None:
    reported: weakref.WeakSet = weakref.WeakSet()

    def after_prepare(accelerator, outputs, **_) -> None:
        if accelerator not in reported and _judge(accelerator, outputs):
            reported.add(accelerator)

    tracker.subscribe("prepare", after_prepare)


def _judge(accelerator, outputs) -> bool:
    """Report the precision the Accelerator ignores; True when something was reported."""
    requested = str(getattr(accelerator, "mixed_precision", "no"))
    if requested not in ("fp16", "bf16"):
        return False
    device = getattr(getattr(accelerator, "device", None), "type", "?")
    if not getattr(accelerator, "native_amp", False):
        report(
            "ACL602",
            f"mixed_precision={requested!r} is ignored on device {device!r}: no autocast and no "
            "GradScaler are applied, so this run trains in fp32; use bf16 on CPU or run fp16 on "
            "a GPU",
            "warning",
        )
        return True
    unwrapped = [
        m for m in outputs if isinstance(m, torch.nn.Module) and not _has_autocast_forward(m)
    ]
    if unwrapped:
        report(
            "ACL602",
            f"a prepared model's forward is not wrapped in {requested} autocast on {device!r}: "
            "it runs in fp32 despite the configuration",
            "warning",
        )
    return bool(unwrapped)


def _has_autocast_forward(model: torch.nn.Module) -> bool:
    inner = getattr(model, "module", model)  # DDP wraps the model accelerate patched
    return hasattr(model, "_original_forward") or hasattr(inner, "_original_forward")
