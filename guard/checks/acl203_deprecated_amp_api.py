"""ACL203 (warning): a deprecated AMP constructor (`torch.cuda.amp.GradScaler(...)`,
`torch.cpu.amp.autocast(...)`) called from the user's code.

torch already emits a FutureWarning, but once per process and easy to lose in a log; the guard
names the code, the call site and the `torch.amp` spelling, once per call site. Calls made
inside libraries are not the user's to fix and are left alone.
"""

from __future__ import annotations

from guard import sources
from guard.checks._common import report

CODES = ("ACL203",)


def install(tracker) -> None:
    sources.ensure(tracker, "deprecated_amp")

    def deprecated(api, replacement, **_) -> None:
        report(
            "ACL203",
            f"{api}(...) is deprecated and will be removed from torch; use {replacement}",
            level="warning",
        )

    tracker.subscribe("deprecated_amp", deprecated)
