"""ACL303: clipping or unscaling partial gradient sums on a non-sync micro-step.

Accelerate: a clip or `unscale_` while `accelerator.sync_gradients` is False (K > 1) is refused
before it runs. Plain loops have no sync flag, so the window shows it: gradients clipped (or
unscaled) and then another backward adds to them before any optimizer step. That is reported
right after that backward: still before the step, and before torch's "unscale_() has already
been called" error in fp16; a second `unscale_` with no step since the first (a zero_grad between
them) is reported before torch raises. The engine's own `clip_grad_norm_` off the update step is
judged by `off_sync`, as a prepared optimizer's.
"""

from __future__ import annotations

from dataclasses import dataclass

from guard.checks._common import report

CODES = ("ACL303",)


@dataclass
class Acted:
    """What acted on this window's gradients before its step (`OptState.of`)."""

    what: str | None = None  # "clip_grad_norm_", "scaler.unscale_", ...


def install(tracker) -> None:
    def before_clip(kind, states, via, **_) -> None:
        if via == "engine":
            return
        _refuse_off_sync(states, f"clip_grad_{kind}_")
        for st in states:
            if st.prepared_by is None:  # prepared optimizers are judged by the sync flag
                st.of(Acted).what = f"clip_grad_{kind}_"

    def before_unscale(state, **_) -> None:
        _refuse_off_sync([state], "unscale_")
        if state.prepared_by is None and state.unscaled and state.of(Acted).what is None:
            _second_unscale(state)  # (still marked: `_after_backward` has reported it)

    def after_unscale(state, **_) -> None:
        acted = state.of(Acted)
        if state.prepared_by is None and acted.what is None:
            acted.what = "scaler.unscale_"

    tracker.subscribe("clip", before_clip)
    tracker.subscribe("unscale_pre", before_unscale)
    tracker.subscribe("unscale", after_unscale)
    tracker.subscribe("backward", _after_backward)
    tracker.subscribe("optimizer_step", lambda state, **_: _forget([state]))
    tracker.subscribe("scaler_step", lambda state, **_: _forget([state]))
    tracker.subscribe("zero_grad", _forget)


def _forget(states, **_) -> None:
    for st in states:
        st.of(Acted).what = None


def _refuse_off_sync(states, what: str) -> None:
    for st in states:
        accelerator = st.prepared_by
        n = getattr(accelerator, "gradient_accumulation_steps", 1) if accelerator else 1
        if n > 1 and not accelerator.sync_gradients:
            off_sync(what, st.backwards, n, "accelerator", "unscale_")
            return


def off_sync(what: str, done: int, n: int, owner: str = "engine", unscale: str = "unscale") -> None:
    """A clip or unscale while `owner`'s window is not complete (`done` of `n` micro-batches):
    an Accelerator's prepared optimizer, or the engine's own `clip_grad_norm_`."""
    report(
        "ACL303",
        f"{what} on a non-sync micro-step ({done} of {n} micro-batches accumulated): it acts "
        f"on a partial sum (and a second {unscale} in the window fails in fp16); put it under "
        f"`if {owner}.sync_gradients:`",
    )


def _second_unscale(st) -> None:
    """`unscale_` again with no optimizer step since the first (a zero_grad between them hides
    the partial sum from `_after_backward`): torch is about to refuse it."""
    report(
        "ACL303",
        f"scaler.unscale_ runs again after {st.backwards} backward pass(es) with no optimizer step "
        "since the last unscale_ (torch refuses a second unscale_ before update()): unscale and "
        "clip only in the branch that steps the optimizer",
    )


def _after_backward(states, via, **_) -> None:
    """A backward added to gradients already clipped/unscaled in this window (before the step)."""
    for st in states:
        what = st.of(Acted).what
        if what is None or via == "engine":
            continue
        report(
            "ACL303",
            f"{what} ran after {st.backwards - 1} backward pass(es), then another backward added "
            "to those gradients before any optimizer step: it acted on a partial sum "
            "(clip(a) + b != clip(a + b)); clip only in the branch that steps the optimizer",
        )
        return
