"""ACL103: `scaler.step`/`unscale_` on an optimizer already stepped since the last `update()`.

Reads torch's per-optimizer stage (private, feature-tested) and names where the previous step
happened, instead of torch's generic RuntimeError.
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
