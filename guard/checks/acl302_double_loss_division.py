"""ACL302 (warning): a loss divided by N by hand and again by `accelerator.backward`.

Accelerate divides the loss by N before its own `loss.backward()`, so the graph root seen there
is that division; a further constant factor of 1/N right behind it is the user's. A warning, not
an error: a divisor can equal N by coincidence. The engine checks its own backward (E1).
"""

from __future__ import annotations

import math

from guard.checks import _graph
from guard.checks._common import report

CODES = ("ACL302",)


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
    user_factor = total * n  # undo Accelerate's own 1/N
    if math.isclose(user_factor, 1.0 / n, rel_tol=1e-6):
        report(
            "ACL302",
            f"the loss reaching accelerator.backward was already divided by {n}, and "
            f"accelerator.backward divides by gradient_accumulation_steps={n} again: each "
            f"micro-batch weighs 1/{n * n} instead of 1/{n} (gradients {n}x too small); "
            "remove the manual division",
            level="warning",
        )
