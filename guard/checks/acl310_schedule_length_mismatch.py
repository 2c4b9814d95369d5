"""ACL310 (warning): a prepared scheduler whose length does not match the run's optimizer steps.

What the guard can know about the plan: the scheduler's own horizon H (`total_steps`, `T_max`,
`total_iters` of a decaying schedule, or for a LambdaLR the step where its factors fall to the
floor, about 0), the optimizer steps taken, and whether the run ended by finishing a pass over its
training loader. It cannot know the planned number of epochs or a `max_steps` budget, so it never
extrapolates the run's length:

- At each real optimizer step it compares the scheduler's position with H. Once the schedule is
  over and training has gone on for more than half as many steps again as the schedule lasted,
  the schedule was exhausted early (e.g. sized per process while stepped W times per optimizer
  step): reported then, during training. Smaller overruns are rounding (floor vs ceil of
  `len(loader) / K` per epoch) and pass.
- At exit, a run that ended at the end of a pass over its training loader, without an uncaught
  exception, is judged for the opposite error: a position below H / 2 means the schedule never
  decayed as planned (e.g. sized in micro-batches under K-step accumulation). A run that stopped
  mid-epoch (a `max_steps` budget, a manual break) or crashed says nothing about the plan.

Not judged: warm-up-only, constant, step-wise (StepLR, MultiStepLR), ExponentialLR, periodic,
chained (SequentialLR) and plateau schedules (no readable end to run out of), and LambdaLRs whose
factors never fall to the floor (warm-up only, or a floor well above 0).
"""

from __future__ import annotations

import math
import sys
import weakref
from dataclasses import dataclass

import torch

from guard import _report, sources
from guard.sources import loaders

CODES = ("ACL310",)
_PROBE_LIMIT = 1 << 24  # largest horizon searched for in a LambdaLR
_PROBE_RATIO = 1.05  # geometric grid of probed steps, refined by bisection
_FLOOR = 1e-3  # a LambdaLR factor this small (relative to its peak) counts as its floor
_UNKNOWN = object()


@dataclass
class _Progress:
    """What one prepared scheduler has shown so far."""

    horizon: object = _UNKNOWN  # H, None when the schedule has no end to run out of
    started: int | None = None  # optimizer steps taken before the scheduler's first one
    ended_at: int | None = None  # the optimizer step that first ran with the schedule over
    last_pass: loaders.LoaderPass | None = None  # the loader pass of its optimizer's latest step
    judged: bool = False


def install(tracker) -> None:
    sources.ensure(tracker, "finish", "loader")
    progress: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    prepared_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def after_prepare(**_) -> None:
        location = _report.user_location()
        for scheduler in list(tracker.prepared_schedulers):
            prepared_at.setdefault(scheduler, location)

    def after_step(state, **_) -> None:
        if not tracker.prepared_schedulers:
            return
        for scheduler, (accelerator, wrapper) in list(tracker.prepared_schedulers.items()):
            entry = progress.setdefault(scheduler, _Progress())
            optimizer = getattr(scheduler, "optimizer", None)
            if entry.judged or optimizer is None or tracker.state(optimizer) is not state:
                continue
            entry.last_pass = loaders.LOADERS.latest_pass
            if _exhausted(scheduler, entry, state.steps):
                entry.judged = True
                _report_exhausted(scheduler, entry, accelerator, wrapper, state.steps, prepared_at)

    def at_finish(**_) -> None:
        if getattr(sys, "last_value", None) is not None:
            return  # the run died early; its schedule position says nothing about the plan
        for scheduler, (accelerator, _wrapper) in list(tracker.prepared_schedulers.items()):
            entry = progress.setdefault(scheduler, _Progress())
            if entry.judged or entry.last_pass is None or not entry.last_pass.finished:
                continue  # stopped mid-epoch (a max_steps budget, a break): not the planned end
            entry.judged = True
            horizon = _horizon(scheduler, entry)
            position = getattr(scheduler, "last_epoch", 0)
            if horizon and 2 <= position and position * 2 < horizon:
                _report_short(scheduler, accelerator, horizon, position, prepared_at)

    tracker.subscribe("prepare", after_prepare)
    tracker.subscribe("optimizer_step", after_step, when="prepared")
    tracker.subscribe("finish", at_finish)


def _horizon(scheduler, entry: _Progress):
    if entry.horizon is _UNKNOWN:
        entry.horizon = horizon_of(scheduler)
    return entry.horizon


def _exhausted(scheduler, entry: _Progress, step: int) -> bool:
    """Whether training has run more than 1.5x as long as the schedule lasted."""
    if entry.started is None:
        entry.started = step - 1  # a scheduler built mid-run counts from its own start
    if entry.ended_at is None:
        horizon = _horizon(scheduler, entry)
        if not horizon or getattr(scheduler, "last_epoch", 0) < horizon:
            return False
        entry.ended_at = step
    lasted = _lasted(entry)  # optimizer steps taken while the schedule was running
    return lasted >= 1 and (step - entry.started - lasted) * 2 > lasted


def _lasted(entry: _Progress) -> int:
    return entry.ended_at - 1 - entry.started


def horizon_of(scheduler) -> int | None:
    """The scheduler position where the schedule is over, for schedules that decay to an end."""
    lr_scheduler = torch.optim.lr_scheduler
    if isinstance(scheduler, lr_scheduler.OneCycleLR):
        return scheduler.total_steps
    if isinstance(scheduler, lr_scheduler.CosineAnnealingLR):
        return scheduler.T_max
    if isinstance(scheduler, lr_scheduler.PolynomialLR):
        return scheduler.total_iters
    if isinstance(scheduler, lr_scheduler.LinearLR):
        decays = scheduler.end_factor < scheduler.start_factor  # else a warm-up
        return scheduler.total_iters if decays else None
    if type(scheduler) is lr_scheduler.LambdaLR:
        return _lambda_floor(scheduler.lr_lambdas)
    return None


def _lambda_floor(lambdas) -> int | None:
    """The first step where every factor is down to its floor (about 0 relative to its peak),
    searched on a geometric grid and refined by bisection; None if it never gets there."""

    def factor(t: int) -> float | None:
        try:
            return max(float(fn(t)) for fn in lambdas)
        except Exception:  # a lambda that cannot be probed out of its run
            return None

    peak, previous, t = 0.0, 0, 1
    while t <= _PROBE_LIMIT:
        value = factor(t)
        if value is None:
            return None
        peak = max(peak, value)
        if peak > 0 and value <= _FLOOR * peak:
            return _bisect(factor, previous, t, _FLOOR * peak)
        previous, t = t, max(t + 1, math.ceil(t * _PROBE_RATIO))
    return None


def _bisect(factor, low: int, high: int, floor: float) -> int:
    """The first step in (low, high] at or below `floor`, for a factor decreasing there."""
    while low + 1 < high:
        mid = (low + high) // 2
        value = factor(mid)
        low, high = (low, mid) if value is not None and value <= floor else (mid, high)
    return high


def _warn(message: str, location: str | None) -> None:
    """Reported at the scheduler's prepare() call, where its length is decided."""
    _report.report("ACL310", f"{message} (accel-lint --explain ACL310)", "warning", location)


def _multiplier(accelerator, wrapper) -> int:
    """How many scheduler steps a prepared scheduler takes per optimizer step."""
    if getattr(wrapper, "split_batches", False):
        return 1
    return max(1, int(getattr(accelerator, "num_processes", 1) or 1))


def _report_exhausted(scheduler, entry, accelerator, wrapper, step, prepared_at) -> None:
    lasted, horizon = _lasted(entry), entry.horizon
    m = _multiplier(accelerator, wrapper)
    hint = (
        f"; a prepared scheduler steps {m}x per optimizer step with {m} processes, so size it "
        "from the unprepared loader (global batches) or multiply warm-up and length by "
        "accelerator.num_processes"
        if m > 1
        else "; size it in optimizer steps for the whole run: "
        "ceil(len(train_dataloader) / gradient_accumulation_steps) * epochs"
    )
    beyond = step - entry.started - lasted
    _warn(
        f"{type(scheduler).__name__} was built for {horizon} steps and ran out after {lasted} "
        f"optimizer steps, but training goes on ({beyond} steps so far) with the learning rate "
        f"at its end value{hint}",
        prepared_at.get(scheduler),
    )


def _report_short(scheduler, accelerator, horizon: int, position: int, prepared_at) -> None:
    n = getattr(accelerator, "gradient_accumulation_steps", 1)
    hint = (
        f"; {position} x K={n} = {position * n}: the length looks counted in micro-batches"
        if n > 1 and abs(position * n - horizon) <= n
        else ""
    )
    _warn(
        f"{type(scheduler).__name__} was built for {horizon} steps but training ended at step "
        f"{position} ({position / horizon:.0%} of the schedule){hint}; size it in optimizer "
        "steps: ceil(len(train_dataloader) / gradient_accumulation_steps) * epochs, from the "
        "loader before prepare()",
        prepared_at.get(scheduler),
    )
