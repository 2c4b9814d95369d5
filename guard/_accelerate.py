"""Patches on HF Accelerate, feeding the same tracker as plain PyTorch loops.

Applied when accelerate is imported (before or after the guard; see `_install.when_imported`).
They only mark who is calling (Accelerate's backward, optimizer or scheduler wrapper, clip) and
emit the Accelerate-specific events; the counters live in the tracker.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any

import torch

from guard import _patch
from guard.events import Event


def install(tracker) -> None:
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler

    _patch_init(tracker, Accelerator)
    _patch_prepare(tracker, Accelerator)
    _patch_owned_calls(tracker, Accelerator)
    _patch_contexts(tracker, Accelerator)
    _wrap_with_flag(tracker, AcceleratedOptimizer, "step", "step_wrapper")
    _wrap_with_flag(tracker, AcceleratedScheduler, "step", "sched_wrapper")


def _patch_init(tracker, cls) -> None:
    init = cls.__init__

    @_patch.wraps_original(init)
    def __init__(accelerator, *args, **kwargs):
        init(accelerator, *args, **kwargs)
        tracker.accelerators.append(weakref.ref(accelerator))
        tracker.establish("accelerator")

    _patch.patch(cls, "__init__", __init__)


def _patch_prepare(tracker, cls) -> None:
    prepare = cls.prepare

    @_patch.wraps_original(prepare)
    def prepare_(accelerator, *args, **kwargs):
        result = prepare(accelerator, *args, **kwargs)
        tracker.establish("accelerator")  # also one built before the guard was installed
        outputs = result if isinstance(result, tuple) else (result,)
        for obj in outputs:
            _register(tracker, accelerator, obj)
        tracker.emit(Event.PREPARE, accelerator=accelerator, inputs=args, outputs=outputs)
        return result

    _patch.patch(cls, "prepare", prepare_)


def _register(tracker, accelerator, obj: Any) -> None:
    """Remember which inner optimizer/scheduler a wrapper owns; hook prepared models' forward."""
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler

    if isinstance(obj, AcceleratedOptimizer):
        st = tracker.state(obj.optimizer)
        st.prepared_by, st.wrapper = accelerator, obj
        tracker.establish("prepared")
    elif isinstance(obj, AcceleratedScheduler):
        tracker.prepared_schedulers[obj.scheduler] = (accelerator, obj)
        tracker.establish("prepared")
    elif isinstance(obj, torch.nn.Module) and not _already_wrapped(obj):
        _wrap_forward(tracker, obj)


def _already_wrapped(model: torch.nn.Module) -> bool:
    return hasattr(model.__dict__.get("forward"), "__guard_original__")


class _AccelerateForward(_patch.TransparentWrapper):
    """Marks the autocast region Accelerate's mixed-precision forward enters as Accelerate's
    (ACL201 tells it from a user's region). Pickled and copied as Accelerate's own wrapper."""

    def __init__(self, tracker, forward) -> None:
        super().__init__(forward)
        self._tracker = tracker

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling() or not self._tracker.active:
            return self.__wrapped__(*args, **kwargs)
        with self._tracker.autocast_origin("accelerate-forward"):
            return self.__wrapped__(*args, **kwargs)


def _wrap_forward(tracker, model: torch.nn.Module) -> None:
    """Only a forward Accelerate itself replaced (mixed precision) is wrapped: without one the
    model runs no autocast of Accelerate's, and the guard adds nothing to it."""
    if "forward" in model.__dict__:
        _patch.patch(model, "forward", _AccelerateForward(tracker, model.__dict__["forward"]))


def _patch_owned_calls(tracker, cls) -> None:
    backward = cls.backward

    @_patch.wraps_original(backward)
    def backward_(accelerator, loss, **kwargs):
        tracker.establish("accelerator")
        with tracker.owning("accelerate"):
            return backward(accelerator, loss, **kwargs)

    _patch.patch(cls, "backward", backward_)
    for kind in ("norm", "value"):
        name = f"clip_grad_{kind}_"
        _patch.patch(cls, name, _announced_clip(tracker, kind, getattr(cls, name)))


def _announced_clip(tracker, kind: str, original):
    """Accelerate's clip, announced as one clip of the parameters passed: which torch functions
    it calls inside (`clip_grad_norm_`, or `get_total_norm` and `clip_grads_with_norm_`, or
    none for an empty list) changes between its versions."""

    @_patch.wraps_original(original)
    def clip(accelerator, parameters, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)

        def run(params, *args, **kwargs):
            return original(accelerator, params, *args, **kwargs)

        return tracker.clipping(kind, params, "accelerate", run, args, kwargs)

    return clip


def _patch_contexts(tracker, cls) -> None:
    accumulate, autocast = cls.accumulate, cls.autocast

    @contextlib.contextmanager
    def accumulate_(accelerator, *models):
        tracker.establish("accumulate")
        try:  # a check raising at the entry (ACL309) still closes it for the others (ACL306)
            tracker.emit(Event.ACCUMULATE_ENTER, accelerator=accelerator, models=models)
            with accumulate(accelerator, *models):
                yield
        finally:  # also when the block raises, so checks tracking the block stay in step
            tracker.emit(Event.ACCUMULATE_EXIT, accelerator=accelerator, models=models)

    @contextlib.contextmanager
    def autocast_(accelerator, *args, **kwargs):
        tracker.emit(Event.ACCELERATE_AUTOCAST, accelerator=accelerator)
        with tracker.autocast_origin("accelerate"), autocast(accelerator, *args, **kwargs):
            yield

    for name, original, wrapper in (
        ("accumulate", accumulate, accumulate_),
        ("autocast", autocast, autocast_),
    ):
        wrapper = functools.wraps(original)(wrapper)
        wrapper.__guard_original__ = original
        _patch.patch(cls, name, wrapper)


def _with_flag(tracker, original, flag: str, value: Any):
    @_patch.wraps_original(original)
    def wrapper(*args, **kwargs):
        with tracker.flag(flag, value):
            return original(*args, **kwargs)

    return wrapper


def _wrap_with_flag(tracker, cls, name: str, flag: str) -> None:
    original = getattr(cls, name)

    @_patch.wraps_original(original)
    def wrapper(obj, *args, **kwargs):
        with tracker.flag(flag, obj):
            return original(obj, *args, **kwargs)

    _patch.patch(cls, name, wrapper)
