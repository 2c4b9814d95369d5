"""ACL403 (warning): `accelerator.gather` on an evaluation loader's last batch that holds padding.

With several processes a prepared loader pads its last batch with repeated samples so that every
process runs the same number of batches; `gather` keeps them (`gather_for_metrics` drops them).
Reported when `gather` is called while the active prepared loader is on its last batch and its
dataset length leaves a remainder (so duplicates are in the result), in an evaluation pass: no
backward ran since the pass's first gather (training loops gathering losses are left alone).
A loop that truncates the last gathered batch itself (`preds[: len(dataset) - samples_seen]`,
as in an older Accelerate example) is correct but indistinguishable at runtime: hence a warning.
"""

from __future__ import annotations

from guard.checks import _sources
from guard.checks._common import report

CODES = ("ACL403",)


def install(tracker) -> None:
    _sources.ensure(tracker, "gather")
    first_gather: dict = {}  # (id(loader), pass) -> tracker.backward_id at the pass's first gather

    def before_gather(accelerator, **_) -> None:
        state = accelerator.gradient_state
        loader = state.active_dataloader
        if loader is None or getattr(accelerator, "num_processes", 1) < 2:
            return
        key = (id(loader), getattr(loader, "iteration", 0))
        seen = first_gather.setdefault(key, tracker.backward_id)
        if not state.end_of_dataloader:
            return
        first_gather.pop(key, None)
        remainder = getattr(state, "remainder", -1)
        evaluating = seen == tracker.backward_id
        if evaluating and remainder is not None and remainder > 0:
            _report(accelerator, loader, remainder)

    tracker.subscribe("gather", before_gather)


def _report(accelerator, loader, remainder: int) -> None:
    total = getattr(loader, "total_batch_size", None)
    padded = f"{total - remainder} repeated sample(s)" if total else "repeated samples"
    report(
        "ACL403",
        f"accelerator.gather on the evaluation loader's last batch keeps the {padded} padded in "
        f"so that {accelerator.num_processes} processes get equal batches: metrics count them "
        "as extra predictions unless the loop truncates them itself; use "
        "accelerator.gather_for_metrics(...), which drops them",
        level="warning",
    )
