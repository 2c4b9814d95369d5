"""The tracker's records: per-optimizer and per-scaler counters, open autocast regions, the
facts a subscription can wait for, and who is calling (see `guard._tracker` for their meaning)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

WINDOW_HISTORY = 8
_CheckState = TypeVar("_CheckState")


@dataclass(eq=False)
class OptState:
    """Per-optimizer counters; see the module docstring."""

    ref: Any  # weakref to the optimizer
    sentinels: list = field(default_factory=list)
    backwards: int = 0
    scaled_backwards: int = 0
    contrib_backwards: int = 0
    contrib_scaled: int = 0
    scaled_pending: bool = False
    scaler: Any = None
    unscaled: bool = False
    steps: int = 0
    skipped_steps: int = 0
    last_step_skipped: bool = False
    windows: list[int] = field(default_factory=list)
    prepared_by: Any = None
    wrapper: Any = None
    hit: int = -1  # id of the last backward pass that reached a sentinel
    checks: dict = field(default_factory=dict)  # a check's state class -> its instance (`of`)
    silenced: dict = field(default_factory=dict)  # code -> the code that silenced it (`suppress`)

    @property
    def optimizer(self):
        return self.ref()

    def of(self, kind: type[_CheckState]) -> _CheckState:
        """This optimizer's state for one check: an instance of that check's own dataclass
        (`kind()`, made on first use), so each check's fields are declared where it lives."""
        found = self.checks.get(kind)
        if found is None:
            found = self.checks[kind] = kind()
        return found

    def suppress(self, code: str, *, because: str) -> None:
        """Silence `code` for this optimizer's current window: the finding `because` already
        reported the same mistake, and one mistake gets one finding."""
        self.silenced[code] = because

    def silenced_by(self, code: str) -> str | None:
        """The code that silenced `code` this window, or None; asked once, at the window's end
        (the answer is forgotten with the window)."""
        return self.silenced.pop(code, None)


@dataclass(eq=False)
class ScalerState:
    """Per-GradScaler counters; see the module docstring."""

    stepped: list = field(default_factory=list)
    updates: int = 0
    skips: int = 0
    consecutive_skips: int = 0
    last_scale: float | None = None


@dataclass
class AutocastFrame:
    device: str
    dtype: Any
    enabled: bool
    origin: str
    grad_enabled: bool
    location: str | None = None


# Facts a subscription can wait for (`subscribe(..., when=fact)`), and who establishes them.
FACTS = {
    "scaled": "an enabled GradScaler scaled a tensor (the tracker's scale wrapper)",
    "autocast": "an enabled autocast region was entered (the tracker's autocast wrappers)",
    "fp16-autocast": "an enabled float16 autocast region was entered (the same wrappers)",
    "accelerator": "an accelerate Accelerator was built (guard._accelerate)",
    "prepared": "an Accelerator or guard.Engine prepared an optimizer or scheduler",
    "accumulate": "Accelerator.accumulate() was entered (guard._accelerate)",
    "ddp": "a DistributedDataParallel wrapper was built or ran a forward (guard.sources)",
    "eval": "a module with children was switched to eval mode (ACL502's own subscriber)",
    "sharded": "FSDP reduce-scattered gradients in a backward (ACL401/405's FSDP wrappers)",
}


@dataclass(eq=False)
class _Subscription:
    event: str
    fn: Callable[..., None]
    when: str | None
    sampled: bool = False  # called only in sampled windows (see `sampled_window`)


def sampled_window(steps: int) -> bool:
    """Whether an optimizer's window after `steps` steps is a sampled one: the first 8 and every
    16th after. A loop's structure (how its losses are divided, how many tokens each micro-batch
    holds) is stable from window to window, so per-micro-step measurements that only describe
    it run in these windows; every rank counts the same steps, so collectives still pair up."""
    return steps < 8 or steps % 16 == 0


class _Flags(threading.local):
    """Who is calling, per thread: set by the wrappers around the caller-owned entry points.

    Per thread because two threads may train at once in one process, each with its own
    optimizer, autocast regions and backward passes (torch's autocast state is per thread too);
    one thread's backward must not be counted, or its autocast region seen, in another's."""

    def __init__(self) -> None:
        self.pass_id: int | None = None  # the backward pass this thread is running
        self.autocast_stack: list[AutocastFrame] = []
        self.regions_since_backward: list[AutocastFrame] = []
        self.owner = "raw"
        self.scaler_step: Any = None
        self.step_wrapper: Any = None
        self.sched_wrapper: Any = None
        self.clip_via = "torch"
        self.clip_open = False  # a clip's events are out and it has not returned yet
        self.autocast_origin = "user"
