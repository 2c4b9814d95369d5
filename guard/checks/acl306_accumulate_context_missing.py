"""ACL306: `gradient_accumulation_steps=K > 1` but the optimizer steps on backward passes made
outside `accelerator.accumulate()`.

`accelerator.backward` divides by K either way, but only `accumulate()` advances the micro-step
counter; without it the prepared optimizer steps on every batch with 1/K of the gradient. A loop
that gates the step on K itself is fine (K passes reach the step; its last window may be a shorter
tail, as in Accelerate's autoregressive example), so the check runs at the step, before it
changes any parameter, and only until the first full window. One finding per optimizer: every
later step repeats the same mistake. It points at the step and names the line of the first
backward outside accumulate() (a helper's, when the loop calls one). The engine checks its own
loops.
"""

from __future__ import annotations

from dataclasses import dataclass

from guard import _report
from guard.checks._common import report

CODES = ("ACL306",)


@dataclass
class Outside:
    """An optimizer's backward passes outside accumulate() (`OptState.of`)."""

    backwards: int = 0  # in this window
    full_window_seen: bool = False  # a window of K passes reached a step: the loop gates itself
    first_backward: str | None = None  # file:line of this window's first such backward
    reported: bool = False


def install(tracker) -> None:
    depth = {"accumulate": 0}

    def enter(**_) -> None:
        depth["accumulate"] += 1

    def leave(**_) -> None:
        depth["accumulate"] = max(0, depth["accumulate"] - 1)

    def after_backward(states, via, **_) -> None:
        if via == "accelerate" and depth["accumulate"] == 0:
            for st in states:
                outside = st.of(Outside)
                if not outside.backwards and not outside.full_window_seen:
                    outside.first_backward = _report.user_location()
                outside.backwards += 1

    tracker.subscribe("accumulate_enter", enter)
    tracker.subscribe("accumulate_exit", leave)
    # only Accelerate's backward is counted, and only a prepared optimizer is judged
    tracker.subscribe("backward", after_backward, when="accelerator")
    tracker.subscribe("optimizer_step_pre", _before_step, when="accelerator")
    tracker.subscribe(
        "optimizer_step", lambda state, **_: _end_window(state.of(Outside)), when="accelerator"
    )


def _end_window(outside: Outside) -> None:
    outside.backwards = 0


def _before_step(state, **_) -> None:
    seen = state.of(Outside)
    outside = seen.backwards
    k = state.contrib_backwards
    accelerator = state.prepared_by
    n = getattr(accelerator, "gradient_accumulation_steps", 1) if accelerator else 1
    if k >= n:
        seen.full_window_seen = True
    if not outside or n <= 1 or k >= n or seen.full_window_seen or seen.reported:
        return
    seen.reported = True
    at = f" (the first at {seen.first_backward})" if seen.first_backward else ""
    report(
        "ACL306",
        f"gradient_accumulation_steps={n}, but this optimizer step uses {k} backward pass(es) "
        f"made outside accelerator.accumulate(){at}, each divided by {n}: the update is {k}/{n} "
        "of the intended gradient and no accumulation happens; "
        "wrap the forward, backward and optimizer calls in `with accelerator.accumulate(model):`",
    )


def engine_backward(n: int) -> None:
    """The engine's case: with K > 1, a backward outside `with engine.accumulate(...)`."""
    report(
        "ACL306",
        f"engine.backward outside engine.accumulate() with gradient_accumulation_steps={n}: "
        f"the loss is divided by {n} but the window never advances, so the optimizer steps on "
        f"every batch with 1/{n} of the gradient; wrap the micro-step in "
        "`with engine.accumulate(model):`",
    )
