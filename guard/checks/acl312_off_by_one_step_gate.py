"""ACL312: the step gate fires one micro-step early: a first window of 1, then windows of k.

`if step % k == 0` over a 0-based `enumerate` steps after the very first micro-batch (1/k of a
window, already divided by k) and shifts every later window by one. Reported at the second
optimizer step, when the window shape is known and before that step runs. Windows count the
backward passes since the last step or `zero_grad` (a GAN's generator pass that also reaches the
discriminator is cleared by `opt_d.zero_grad()` and does not count).
"""

from __future__ import annotations

from dataclasses import dataclass

from guard.checks._common import report

CODES = ("ACL312",)


@dataclass
class FirstWindow:
    """The backward passes of an optimizer's first window (`OptState.of`)."""

    backwards: int | None = None


def install(tracker) -> None:
    tracker.subscribe("optimizer_step_pre", _before_step)


def _before_step(state, **_) -> None:
    k = state.contrib_backwards
    if state.steps == 0:
        state.of(FirstWindow).backwards = k
        return
    if state.steps != 1 or state.of(FirstWindow).backwards != 1 or k < 2:
        return
    report(
        "ACL312",
        f"the first optimizer step used 1 micro-batch and this one uses {k}: the step gate "
        f"fires one micro-step early (`i % {k} == 0` over a 0-based index), so the first update "
        f"is 1/{k} of a window and every later window is shifted; use `(i + 1) % {k} == 0`",
    )
