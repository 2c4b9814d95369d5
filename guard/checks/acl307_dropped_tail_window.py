"""ACL307: a pass over a sized loader ends with micro-batches that no optimizer step consumed.

The loop stepped during the pass (so it steps per window, not once per epoch), yet backward
passes made since the last step are still in `.grad` when the loader is exhausted. That alone is
not the bug: a step-based loop (nanoGPT's `while` over `next(iter(loader))`, a global counter)
finishes the window with the next pass on purpose. So the tail is noted at the pass end and
judged by what happens to it:

- the next step of that optimizer takes more backward passes than its usual window: the tail
  leaked into the next epoch's first window (K + r micro-batches). An error, raised before that
  step changes any parameter;
- a `zero_grad` throws it away before any step (an epoch that starts with `zero_grad()`): an
  error, at that call;
- the run ends with it still in `.grad` (the last epoch's tail, lost): a warning at exit.
A window that completes with the usual number of passes spanned the boundary on purpose. The
finding goes to the step gate (where the last-batch clause goes, `guard.checks._gate`), once per
optimizer and gate: each later epoch's tail is the same mistake.
Accelerate's prepared loaders flush the tail themselves (their inner loader ends one batch
early, while Accelerate's loader is still active), and iterable datasets may span windows across
epochs on purpose; both are left alone.
"""

from __future__ import annotations

import sys
import weakref
from collections import Counter
from dataclasses import dataclass, field

from guard import _report, sources
from guard.checks import _gate
from guard.checks._common import report

CODES = ("ACL307",)


@dataclass
class _Tail:
    """Micro-batches left in `.grad` when a pass ended, and where that pass was iterated."""

    backwards: int  # the optimizer's contributing backward passes at the pass end
    batches: object  # len(loader), or "?"
    location: str | None  # the loop over the loader
    step_sites: tuple  # the user's frames around the pass's first step (`_gate.call_sites`)


@dataclass
class _Gate:
    """Where an optimizer steps (`OptState.of`): its step call's frames, taken at the first step
    after a pass starts, and the gates already reported."""

    sites: tuple = ()
    passes: int = -1  # the pass count when `sites` was taken
    reported: set = field(default_factory=set)


def install(tracker) -> None:
    sources.ensure(tracker, "loader", "finish")
    started: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # iterator -> (steps, id)
    counters = {"steps": 0, "backward_at_last_step": 0, "passes": 0}
    tails: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # OptState -> _Tail

    def after_step(state, **_) -> None:
        counters["steps"] += 1
        counters["backward_at_last_step"] = tracker.backward_id
        gate = state.of(_Gate)
        if gate.passes != counters["passes"]:  # one frame walk per pass, not per step
            gate.sites, gate.passes = _gate.call_sites(), counters["passes"]

    def first_batch(iterator, **_) -> None:
        counters["passes"] += 1
        started[iterator] = (counters["steps"], tracker.backward_id)

    def pass_ended(iterator, **_) -> None:
        steps_at_start, backward_at_start = started.pop(iterator, (None, None))
        if steps_at_start is None or steps_at_start == counters["steps"] or not _sized(iterator):
            return
        if _accelerate_loader_active() or tracker.backward_id == counters["backward_at_last_step"]:
            return  # every backward was followed by some optimizer step (GANs included)
        for st in list(tracker.optimizers.values()):
            if st.contrib_backwards and st.hit > backward_at_start and st.prepared_by is None:
                total = len(iterator) if hasattr(iterator, "__len__") else "?"
                sites = st.of(_Gate).sites
                tails[st] = _Tail(st.contrib_backwards, total, _report.user_location(), sites)
                return

    def before_step(state, **_) -> None:
        tail = tails.pop(state, None)
        if tail is None:  # every step but the first after a pass that left a tail
            return
        usual = _usual_window(state)
        if usual is None or state.backwards > usual:
            _report_tail(state, tail, usual, "leaks into this step's window")

    def before_zero_grad(states, **_) -> None:
        for st in states:
            tail = tails.pop(st, None)
            if tail is not None and st.contrib_backwards:
                _report_tail(st, tail, _usual_window(st), "is thrown away by this zero_grad")

    def at_finish(**_) -> None:
        for st, tail in list(tails.items()):
            if st.contrib_backwards:
                _report_tail(st, tail, _usual_window(st), "is lost: the run ended", "warning")
        tails.clear()

    tracker.subscribe("optimizer_step", after_step)
    tracker.subscribe("loader_start", first_batch)
    tracker.subscribe("loader_end", pass_ended)
    tracker.subscribe("optimizer_step_pre", before_step)
    tracker.subscribe("zero_grad", before_zero_grad)
    tracker.subscribe("finish", at_finish)


def _usual_window(st) -> int | None:
    """The optimizer's most common number of backward passes per step so far."""
    windows = [w for w in st.windows if w]
    return Counter(windows).most_common(1)[0][0] if windows else None


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


def _report_tail(st, tail: _Tail, usual: int | None, fate: str, level="error") -> None:
    """Report the tail at its optimizer's step gate, unless that gate was already reported."""
    location = _gate.gate_location(tail.step_sites) or tail.location
    reported = st.of(_Gate).reported
    if location in reported:
        return
    reported.add(location)
    steps_use = f" (steps use {usual})" if usual else ""
    report(
        "ACL307",
        f"the pass over the loader{_loop_at(tail.location, location)} ended ({tail.batches} "
        f"batches) with {tail.backwards} micro-batch(es) of an unfinished window{steps_use} "
        f"still in .grad, and that tail {fate}: each epoch's tail joins the next epoch's first "
        "window or is dropped, and the last one is lost; add a last-batch clause to the step "
        "gate (`or i + 1 == len(loader)`)",
        level,
        location,
    )


def _loop_at(loop: str | None, gate: str | None) -> str:
    """' at line 15' (or ' at file:15' in another file than the gate's): the loop's place."""
    if not loop or loop == gate:
        return ""
    loop_file, _, line = loop.rpartition(":")
    same_file = gate is not None and gate.rpartition(":")[0] == loop_file
    return f" at line {line}" if same_file else f" at {loop}"


def engine_tail(r: int, n: int) -> None:
    """The engine's case (a note, not a finding): a tail window of r < K micro-batches was
    flushed with Accelerate's 1/K, the engine's documented default; a correct loop, so nothing
    is reported."""
    _report.note(
        "ACL307",
        f"the loader ended after {r} of {n} micro-batches of a window; the engine stepped on "
        f"them, each divided by {n} as Accelerate does, so this tail counts {r}/{n} of a full "
        f"window; Engine(tail='exact') gives it the weight of a full batch "
        "(accel-lint --explain ACL307)",
    )
