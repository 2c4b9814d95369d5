"""ACL302 (warning): a loss divided by K by hand and again by `accelerator.backward`.

Accelerate divides the loss by K before its own `loss.backward()`, so the graph root seen there
is that division; a further constant factor of 1/K right behind it is the user's. A warning, not
an error: a divisor can equal K by coincidence. The engine's backward is judged by
`engine_backward`, which also reports a loss divided by the world size (ACL402).
"""

from __future__ import annotations

import math

import torch

from guard import _report
from guard.checks import _graph
from guard.checks._common import report

CODES = ("ACL302", "ACL402")  # ACL402 only for the engine's backward (`engine_backward`)
_FACTOR_ROOTS = ("DivBackward0", "MulBackward0")


def install(tracker) -> None:
    def before_backward(tensors, via, **_) -> None:
        if via != "accelerate" or not tensors:
            return
        accelerator = tracker.accelerator()
        n = getattr(accelerator, "gradient_accumulation_steps", 1) if accelerator else 1
        if n > 1:
            _check(tensors[0], n)

    tracker.subscribe("backward_pre", before_backward, when="accelerator")


def _check(root, n: int) -> None:
    total = _graph.root_factor(root)
    if total is None:
        return
    user_factor = total * n  # undo Accelerate's own 1/K
    if math.isclose(user_factor, 1.0 / n, rel_tol=1e-6):
        report(
            "ACL302",
            f"the loss reaching accelerator.backward was already divided by {n}, and "
            f"accelerator.backward divides by gradient_accumulation_steps={n} again: each "
            f"micro-batch weighs 1/{n * n} instead of 1/{n} (gradients {n}x too small); "
            "remove the manual division",
            level="warning",
        )


def engine_backward(loss: torch.Tensor, n: int, world: int) -> None:
    """The engine's case, ACL302 and ACL402: the loss reaching engine.backward was already
    divided by K or by W (the engine divides by K, DDP averages over W)."""
    if n == 1 and world == 1 or type(loss.grad_fn).__name__ not in _FACTOR_ROOTS:
        return  # the usual case: the loss's root is the loss function itself, not a factor
    if not (_report.enabled("ACL302") or _report.enabled("ACL402")):
        return
    factor = _graph.root_factor(loss)
    if factor is None or factor == 1.0:
        return
    if n > 1 and (_close(factor, 1 / n) or world > 1 and _close(factor, 1 / (n * world))):
        report(
            "ACL302",
            f"the loss passed to engine.backward is already multiplied by {factor:g} = 1/{n}, "
            f"and the engine divides by K={n} again: gradients are {n}x too small; pass the "
            "undivided loss",
            "warning",
        )
    if world > 1 and (_close(factor, 1 / world) or _close(factor, 1 / (n * world))):
        report(
            "ACL402",
            f"the loss passed to engine.backward is divided by the world size {world}: DDP "
            f"already averages gradients over the {world} processes, so they end {world}x too "
            "small; pass the undivided loss",
            "warning",
        )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)
