"""ACL310 (warning): a prepared scheduler whose length does not match the run's optimizer steps.

At the end of the run (before the report is written) each prepared scheduler with a readable
horizon H (`total_steps`, `T_max`, `total_iters`, or the step where a LambdaLR's factors reach
0) is compared with the position it reached: far short of H (< 1/2) means the schedule never
decays as planned (e.g. sized in micro-batches under N-step accumulation); far past it (> 3/2)
means the learning rate sat at its floor (e.g. sized per process while stepping W times per
optimizer step). A run that ends with an uncaught exception (a crash, Ctrl-C, a GuardError) did
not reach its planned end and is not judged.
"""

from __future__ import annotations

import sys
import weakref

from guard import _report
from guard.checks import _sources

CODES = ("ACL310",)
_PROBE_LIMIT = 1 << 24  # largest horizon searched for in a LambdaLR


def install(tracker) -> None:
    _sources.ensure(tracker, "finish")
    prepared_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    judged: weakref.WeakSet = weakref.WeakSet()

    def after_prepare(**_) -> None:
        location = _report.user_location()
        for scheduler in list(tracker.prepared_schedulers):
            prepared_at.setdefault(scheduler, location)

    def at_finish(**_) -> None:
        if getattr(sys, "last_value", None) is not None:
            return  # the run died early; its schedule position says nothing about the plan
        for scheduler, (accelerator, _wrapper) in list(tracker.prepared_schedulers.items()):
            if scheduler in judged:
                continue
            judged.add(scheduler)
            horizon = horizon_of(scheduler)
            position = getattr(scheduler, "last_epoch", 0)
            if horizon and position >= 2:
                _check(scheduler, accelerator, horizon, position, prepared_at.get(scheduler))

    tracker.subscribe("prepare", after_prepare)
    tracker.subscribe("finish", at_finish)


def horizon_of(scheduler) -> int | None:
    """The number of scheduler steps after which the schedule is over, when it can be read."""
    for attribute in ("total_steps", "T_max", "total_iters"):
        value = getattr(scheduler, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas:
        return _lambda_floor(lambdas)
    return None


def _lambda_floor(lambdas) -> int | None:
    """The first step where every factor is 0, for schedules that decay to 0 and stay there."""

    def over(t: int) -> bool:
        try:
            return all(float(fn(t)) <= 0.0 for fn in lambdas)
        except Exception:
            return False

    high = 1
    while not over(high):
        high *= 2
        if high > _PROBE_LIMIT:
            return None
    low = high // 2
    while low + 1 < high:
        mid = (low + high) // 2
        low, high = (low, mid) if over(mid) else (mid, high)
    return high


def _warn(message: str, location: str | None) -> None:
    """Reported at the scheduler's prepare() call: at exit the user's frame is gone."""
    _report.report("ACL310", f"{message} (accel-lint --explain ACL310)", "warning", location)


def _check(scheduler, accelerator, horizon: int, position: int, location) -> None:
    n = getattr(accelerator, "gradient_accumulation_steps", 1)
    w = getattr(accelerator, "num_processes", 1)
    name = type(scheduler).__name__
    if position * 2 < horizon:
        hint = (
            f"; {position} x N={n} = {position * n}: the length looks counted in micro-batches"
            if n > 1 and abs(position * n - horizon) <= n
            else ""
        )
        _warn(
            f"{name} was built for {horizon} steps but training ended at step {position} "
            f"({position / horizon:.0%} of the schedule){hint}; size it in optimizer steps: "
            "ceil(len(train_dataloader) / gradient_accumulation_steps) * epochs, from the "
            "loader before prepare()",
            location,
        )
    elif position * 2 > horizon * 3:
        hint = f" (it steps {w}x per optimizer step with {w} processes)" if w > 1 else ""
        _warn(
            f"{name} was built for {horizon} steps but was stepped {position} times{hint}: the "
            f"learning rate sat at its end value for the last {position - horizon} steps; size "
            "it from the unprepared loader (global batches) or multiply warm-up and length by "
            "accelerator.num_processes",
            location,
        )
