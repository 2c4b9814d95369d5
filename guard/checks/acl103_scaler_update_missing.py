"""ACL103: `scaler.update()` missing between two iterations of a GradScaler loop.

Reads torch's per-optimizer stage (private, feature-tested). Two signals:

- At `scaler.step`/`unscale_` on an optimizer already STEPPED since the last `update()`: names
  where the previous step happened, instead of torch's generic RuntimeError.
- Earlier, after a scaled backward whose gradients reach only optimizers that this scaler has
  already stepped since its last `update()`: those gradients can only be consumed by stepping a
  STEPPED optimizer again, which torch refuses, so a new iteration has begun without the update.

The second signal is judged by the backward's reach, not at the next forward: in a GAN loop the
generator's forward and scaled backward run through the discriminator after `scaler.step(opt_d)`
and before the single `update()`, but that backward also reaches the generator's optimizer,
which is not stepped yet. Parameters never change before either signal fires. The one valid
loop it refuses calls `update()` late, between the next iteration's backward and its step.
"""

from __future__ import annotations

import weakref

from guard import _private, _report
from guard.checks._common import report

CODES = ("ACL103",)
_last_step: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def install(tracker) -> None:
    tracker.subscribe("scaler_step_pre", _before)
    tracker.subscribe("unscale_pre", _before)
    tracker.subscribe("scaler_step", _remember)
    tracker.subscribe("backward", _after_scaled_backward, when="scaled")


def _remember(optimizer, **_) -> None:
    _last_step[optimizer] = _report.user_location()


def _before(scaler, optimizer, **_) -> None:
    if _private.scaler_stage(scaler, optimizer, "ACL103") != "STEPPED":
        return
    where = _last_step.get(optimizer) or "an earlier line"
    report(
        "ACL103",
        f"scaler.step(opt) already ran at {where} and scaler.update() has not been called "
        "since; call scaler.update() once after the optimizer step(s) of every iteration",
    )


def _after_scaled_backward(scaled_by, states, **_) -> None:
    if scaled_by is None or not states or not _report.enabled("ACL103"):
        return
    optimizers = [st.optimizer for st in states]
    if any(opt is None or opt not in _last_step for opt in optimizers):
        return  # some reached optimizer was never stepped by a scaler: this window is open
    if any(_private.scaler_stage(scaled_by, opt, "ACL103") != "STEPPED" for opt in optimizers):
        return
    where = _last_step.get(optimizers[0]) or "an earlier line"
    report(
        "ACL103",
        f"this scaled backward starts a new iteration, but scaler.step(opt) already ran at "
        f"{where} and scaler.update() has not been called since, so the coming scaler.step "
        "will fail; call scaler.update() once after the optimizer step(s) of every iteration",
    )
