"""The guard's event contract: every event the tracker and its sources emit, and what it carries.

An event is an `Event` member; its payload is the frozen dataclass `PAYLOADS[event]`, whose
fields are the keyword arguments a subscriber receives (`fn(**payload)`; accept `**_` for the
ones you ignore). `Tracker.subscribe` refuses a name that is not an `Event` and a subscriber that
asks for a field its event does not carry, so a typo fails at install, not silently at runtime.
Emitters pass the fields as keywords (no object is built on the micro-step path);
tests/guard/test_events.py checks every `emit` call in guard/ against these dataclasses.

A check that raises `GuardError` from a `*_pre` event stops the operation before it has any
effect. States are `guard._tracker_state.OptState` / `ScalerState`; `via` names who called:
"raw" (user code), "accelerate" (`Accelerator.backward`) or "engine".
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Event(str, Enum):
    """The events, by the name subscribers use (a member equals its plain-string value)."""

    BACKWARD_PRE = "backward_pre"
    BACKWARD = "backward"
    OPTIMIZER_STEP_PRE = "optimizer_step_pre"
    OPTIMIZER_STEP = "optimizer_step"
    ZERO_GRAD = "zero_grad"
    SCALE = "scale"
    UNSCALE_PRE = "unscale_pre"
    UNSCALE = "unscale"
    SCALER_STEP_PRE = "scaler_step_pre"
    SCALER_STEP = "scaler_step"
    UPDATE = "update"
    CLIP = "clip"
    CLIP_DONE = "clip_done"
    SCHEDULER_STEP_PRE = "scheduler_step_pre"
    AUTOCAST_ENTER = "autocast_enter"
    AUTOCAST_EXIT = "autocast_exit"
    PREPARE = "prepare"
    ACCUMULATE_ENTER = "accumulate_enter"
    ACCUMULATE_EXIT = "accumulate_exit"
    ACCELERATE_AUTOCAST = "accelerate_autocast"
    LOADER_START = "loader_start"
    LOADER_END = "loader_end"
    SAMPLER_ITER = "sampler_iter"
    SAMPLER_END = "sampler_end"
    DDP_CREATED = "ddp_created"
    DDP_FORWARD = "ddp_forward"
    DDP_COMM_HOOK = "ddp_comm_hook"
    TRAIN_MODE = "train_mode"
    GATHER = "gather"
    DIST_GATHER = "dist_gather"
    DEPRECATED_AMP = "deprecated_amp"
    FINISH = "finish"


# -- the tracker's own patches (guard._tracker, _tracker_optim, _tracker_amp) ----------------


@dataclass(frozen=True)
class BackwardPre:
    """Before autograd runs. `tensors`: the roots; `scaled_by`: the enabled GradScaler whose
    `scale()` produced the first root, or None."""

    tensors: tuple
    scaled_by: Any
    via: str


@dataclass(frozen=True)
class Backward:
    """After autograd ran; `states`: the optimizers whose parameters received gradients in this
    pass (their counters already updated)."""

    tensors: tuple
    scaled_by: Any
    via: str
    states: list


@dataclass(frozen=True)
class OptimizerStepPre:
    """torch's global step pre-hook, before any parameter changes. `via_wrapper`: the
    Accelerate/engine wrapper stepping it, or None."""

    optimizer: Any
    state: Any
    in_scaler_step: bool
    via_wrapper: Any


@dataclass(frozen=True)
class OptimizerStep:
    """After an optimizer's step."""

    optimizer: Any
    state: Any


@dataclass(frozen=True)
class ZeroGrad:
    """Before `Optimizer.zero_grad` / `Module.zero_grad`."""

    owner: Any
    states: list
    set_to_none: bool


@dataclass(frozen=True)
class Scale:
    """After an enabled `GradScaler.scale`: `outputs` the unscaled input, `scaled` the result."""

    scaler: Any
    outputs: Any
    scaled: Any


@dataclass(frozen=True)
class Unscale:
    """Around an enabled `GradScaler.unscale_` (`unscale_pre` before, `unscale` after)."""

    scaler: Any
    optimizer: Any
    state: Any


@dataclass(frozen=True)
class ScalerStepPre:
    """Before an enabled `GradScaler.step`."""

    scaler: Any
    optimizer: Any
    state: Any


@dataclass(frozen=True)
class ScalerStep:
    """After `GradScaler.step`; `ran`: whether the inner optimizer's `step()` was called (False
    = skipped on inf)."""

    scaler: Any
    optimizer: Any
    state: Any
    ran: bool


@dataclass(frozen=True)
class Update:
    """After `GradScaler.update`; `skipped`: the scale backed off or the scaler recorded inf/NaN
    (its found-inf state) for the step(s) since the last update."""

    scaler: Any
    sstate: Any
    skipped: bool
    scale_before: Any
    scale_after: Any


@dataclass(frozen=True)
class Clip:
    """Before torch's `clip_grad_norm_` / `clip_grad_value_`. `kind`: "norm" or "value";
    `parameters`: the materialised list passed on; `via`: "torch", "accelerate" or "engine"; a
    check may append to `redirect` a callable that runs instead of torch's function, with its
    remaining arguments."""

    kind: str
    parameters: list
    states: list
    via: str
    redirect: list


@dataclass(frozen=True)
class ClipDone:
    """After the clip: `limit` is the `max_norm` / `clip_value` passed, `result` torch's return
    value (the total norm before clipping, for "norm")."""

    kind: str
    parameters: list
    states: list
    via: str
    result: Any
    limit: Any


@dataclass(frozen=True)
class SchedulerStepPre:
    """Before `LRScheduler.step` (not its constructor's call); `state`: its optimizer's."""

    scheduler: Any
    state: Any
    via_wrapper: Any


@dataclass(frozen=True)
class AutocastEnter:
    """An autocast region was just entered (raising leaves it again); `ambient_*` is the state
    it replaced; `origin`: "user", "accelerate", "accelerate-forward" or "engine"."""

    device: str
    dtype: Any
    enabled: bool
    origin: str
    ambient_enabled: bool
    ambient_dtype: Any


@dataclass(frozen=True)
class AutocastExit:
    """An autocast region was left; `frame` is its `AutocastFrame`."""

    frame: Any


# -- Accelerate (guard._accelerate) -----------------------------------------------------------


@dataclass(frozen=True)
class Prepare:
    """After `Accelerator.prepare`."""

    accelerator: Any
    inputs: tuple
    outputs: Any


@dataclass(frozen=True)
class Accumulate:
    """`Accelerator.accumulate()` entered (`accumulate_enter`) or left (`accumulate_exit`)."""

    accelerator: Any
    models: tuple


@dataclass(frozen=True)
class AccelerateAutocast:
    """`Accelerator.autocast()` is being entered."""

    accelerator: Any


# -- the checks' sources (guard.sources) ------------------------------------------------------


@dataclass(frozen=True)
class Loader:
    """A DataLoader iterator produced its first batch (`loader_start`: a pass began) or is
    exhausted (`loader_end`). There is no event per batch: `guard.sources.LOADERS` counts them."""

    iterator: Any


@dataclass(frozen=True)
class SamplerIter:
    """A `DistributedSampler` starts a pass."""

    sampler: Any


@dataclass(frozen=True)
class SamplerEnd:
    """That pass handed out all its indices; `epoch`: the one its order was drawn with."""

    sampler: Any
    epoch: Any


@dataclass(frozen=True)
class DdpCreated:
    """A `DistributedDataParallel` wrapper was built."""

    module: Any


@dataclass(frozen=True)
class DdpForward:
    """A DDP forward with gradients enabled; `sync`: its `require_backward_grad_sync`."""

    module: Any
    sync: bool


@dataclass(frozen=True)
class DdpCommHook:
    """`register_comm_hook` gave a DDP wrapper a communication hook (it decides how gradients
    are reduced: a hook may sum instead of averaging)."""

    module: Any
    hook: Any


@dataclass(frozen=True)
class TrainMode:
    """The outermost `Module.train(mode)` / `Module.eval()` call."""

    module: Any
    mode: bool


@dataclass(frozen=True)
class Gather:
    """The user's `Accelerator.gather` (not one made by `gather_for_metrics`) returned."""

    accelerator: Any
    result: Any


@dataclass(frozen=True)
class DistGather:
    """User code called `torch.distributed.all_gather*`; `parts`: one entry per rank."""

    parts: list


@dataclass(frozen=True)
class DeprecatedAmp:
    """User code constructed a deprecated AMP class; `replacement`: its `torch.amp` spelling."""

    api: str
    replacement: str


@dataclass(frozen=True)
class Finish:
    """The run is ending, before the guard writes its report (end-of-run checks)."""


PAYLOADS: dict[Event, type] = {
    Event.BACKWARD_PRE: BackwardPre,
    Event.BACKWARD: Backward,
    Event.OPTIMIZER_STEP_PRE: OptimizerStepPre,
    Event.OPTIMIZER_STEP: OptimizerStep,
    Event.ZERO_GRAD: ZeroGrad,
    Event.SCALE: Scale,
    Event.UNSCALE_PRE: Unscale,
    Event.UNSCALE: Unscale,
    Event.SCALER_STEP_PRE: ScalerStepPre,
    Event.SCALER_STEP: ScalerStep,
    Event.UPDATE: Update,
    Event.CLIP: Clip,
    Event.CLIP_DONE: ClipDone,
    Event.SCHEDULER_STEP_PRE: SchedulerStepPre,
    Event.AUTOCAST_ENTER: AutocastEnter,
    Event.AUTOCAST_EXIT: AutocastExit,
    Event.PREPARE: Prepare,
    Event.ACCUMULATE_ENTER: Accumulate,
    Event.ACCUMULATE_EXIT: Accumulate,
    Event.ACCELERATE_AUTOCAST: AccelerateAutocast,
    Event.LOADER_START: Loader,
    Event.LOADER_END: Loader,
    Event.SAMPLER_ITER: SamplerIter,
    Event.SAMPLER_END: SamplerEnd,
    Event.DDP_CREATED: DdpCreated,
    Event.DDP_FORWARD: DdpForward,
    Event.DDP_COMM_HOOK: DdpCommHook,
    Event.TRAIN_MODE: TrainMode,
    Event.GATHER: Gather,
    Event.DIST_GATHER: DistGather,
    Event.DEPRECATED_AMP: DeprecatedAmp,
    Event.FINISH: Finish,
}


def fields(event: Event) -> tuple[str, ...]:
    """The keyword arguments `event` carries."""
    return tuple(f.name for f in dataclasses.fields(PAYLOADS[event]))


def checked(event: str, fn: Callable[..., Any]) -> Event:
    """`event` as an `Event`, after checking that `fn` can take its payload: ValueError for an
    unknown name, TypeError for a subscriber that asks for a field the event does not carry."""
    try:
        member = Event(event)
    except ValueError:
        known = ", ".join(e.value for e in Event)
        raise ValueError(f"unknown event {event!r}; known: {known}") from None
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return member
    carried = set(fields(member))
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = sorted(
        p.name
        for p in parameters
        if p.name in named and p.name not in carried and p.default is p.empty
    )
    if missing:
        raise TypeError(
            f"a subscriber to {member.value!r} asks for {', '.join(missing)}, which it does not "
            f"carry; it carries: {', '.join(fields(member)) or 'nothing'}"
        )
    return member
