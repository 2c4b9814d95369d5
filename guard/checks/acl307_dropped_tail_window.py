"""ACL307: a pass over a sized loader ends with micro-batches that no optimizer step consumed.

The loop stepped during the pass (so it steps per window, not once per epoch), yet backward
passes made since the last step are still in `.grad` when the loader is exhausted: the gate has
no last-batch clause, and the tail either leaks into the next epoch's first window or is lost.
Accelerate's prepared loaders flush the tail themselves (their inner loader ends one batch
early, while Accelerate's loader is still active), and iterable datasets may span windows across
epochs on purpose; both are left alone.
"""

from __future__ import annotations

import sys
import weakref

from guard.checks import _sources
from guard.checks._common import report

CODES = ("ACL307",)


def install(tracker) -> None:
    _sources.ensure(tracker, "loader")
    started: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # iterator -> (steps, id)
    counters = {"steps": 0, "backward_at_last_step": 0}

    def after_step(**_) -> None:
        counters["steps"] += 1
        counters["backward_at_last_step"] = tracker.backward_id

    def first_batch(iterator, **_) -> None:
        started[iterator] = (counters["steps"], tracker.backward_id)

    def pass_ended(iterator, **_) -> None:
        steps_at_start, backward_at_start = started.pop(iterator, (None, None))
        if steps_at_start is None or steps_at_start == counters["steps"] or not _sized(iterator):
            return
        if _accelerate_loader_active() or tracker.backward_id == counters["backward_at_last_step"]:
            return  # every backward was followed by some optimizer step (GANs included)
        for st in list(tracker.optimizers.values()):
            if st.contrib_backwards and st.hit > backward_at_start and st.prepared_by is None:
                _report(iterator, st)
                return

    tracker.subscribe("optimizer_step", after_step)
    tracker.subscribe("loader_start", first_batch)
    tracker.subscribe("loader_end", pass_ended)


def _sized(iterator) -> bool:
    try:
        len(iterator._dataset)
    except (TypeError, AttributeError, NotImplementedError):
        return False
    return True


def _accelerate_loader_active() -> bool:
    state_mod = sys.modules.get("accelerate.state")
    if state_mod is None:
        return False
    shared = getattr(state_mod.GradientState, "_shared_state", {})
    return shared.get("active_dataloader") is not None


def _report(iterator, st) -> None:
    windows = [w for w in st.windows if w] or [0]
    n = max(set(windows), key=windows.count)
    total = len(iterator) if hasattr(iterator, "__len__") else "?"
    report(
        "ACL307",
        f"the loader is exhausted ({total} batches) with {st.contrib_backwards} micro-batch(es) "
        f"of an unfinished window (steps use {n}) still in .grad: they never reach the optimizer "
        "in this epoch, leak into the next epoch's first window, and are lost after the last "
        "epoch; add a last-batch clause to the step gate (`or i + 1 == len(loader)`)",
    )
