"""The event sources the checks need beyond the tracker's own patches (guard/events.py lists
every event and its payload).

They follow the tracker's rules: each patch goes through `guard._patch` (so `uninstall()` restores
it) and only emits an event; the checks subscribe. `ensure(tracker, name, ...)` installs a source
once per installation: "loader" and "sampler" (`loaders`), "ddp" and "train_mode" (`modules`),
"gather" and "dist_gather" (`gathers`), "deprecated_amp" (`amp`) and "finish" (the run's end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guard import _report
from guard.events import Event
from guard.sources import amp, gathers, loaders, modules


def ensure(tracker, *names: str) -> None:
    """Install the named sources (idempotent while the guard stays installed)."""
    for name in names:
        _SOURCES[name](tracker)


_finish_hooked: list = []


def _finish(tracker) -> None:
    """One exit hook per process; it reaches whichever checks are subscribed at exit time."""
    if not _finish_hooked:
        _finish_hooked.append(True)
        _report.before_exit(lambda: tracker.emit(Event.FINISH) if tracker.active else None)


_SOURCES: dict[str, Callable[[Any], None]] = {
    "loader": loaders.loader,
    "sampler": loaders.sampler,
    "ddp": modules.ddp,
    "train_mode": modules.train_mode,
    "gather": gathers.gather,
    "dist_gather": gathers.dist_gather,
    "finish": _finish,
    "deprecated_amp": amp.deprecated_amp,
}
