"""Gather sources: the events `gather` (Accelerate's) and `dist_gather` (torch.distributed's)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from guard import _install, _patch
from guard.events import Event
from guard.sources._hooks import called_by_user, installed

_local = threading.local()


def gather(tracker) -> None:
    def patch_accelerate(_module) -> None:
        from accelerate import Accelerator

        if installed(Accelerator, "gather"):
            return
        gather, for_metrics = Accelerator.gather, Accelerator.gather_for_metrics

        @_patch.wraps_original(gather)
        def gather_(accelerator, tensor):
            result = gather(accelerator, tensor)
            if not _in_gather_for_metrics():
                tracker.emit(Event.GATHER, accelerator=accelerator, result=result)
            return result

        @_patch.wraps_original(for_metrics)
        def gather_for_metrics_(accelerator, *args, **kwargs):
            previous, _local.in_gather_for_metrics = _in_gather_for_metrics(), True
            try:  # gather_for_metrics calls gather itself: not a user call
                return for_metrics(accelerator, *args, **kwargs)
            finally:
                _local.in_gather_for_metrics = previous

        _patch.patch(Accelerator, "gather", gather_)
        _patch.patch(Accelerator, "gather_for_metrics", gather_for_metrics_)

    _install.when_imported("accelerate", patch_accelerate)


def _in_gather_for_metrics() -> bool:
    return getattr(_local, "in_gather_for_metrics", False)


def dist_gather(tracker) -> None:

    import torch.distributed as dist

    if not dist.is_available() or installed(dist, "all_gather"):
        return

    def wrap(name: str, keyword: str, output_parts: Callable[[Any], list]) -> None:
        original = getattr(dist, name)

        @_patch.wraps_original(original)
        def all_gather_(*args, **kwargs):  # torch.distributed.checkpoint passes keywords
            result = original(*args, **kwargs)
            if called_by_user():
                output = args[0] if args else kwargs.get(keyword)
                tracker.emit(Event.DIST_GATHER, parts=output_parts(output))
            return result

        _patch.patch(dist, name, all_gather_)

    wrap("all_gather", "tensor_list", list)
    wrap("all_gather_object", "object_list", list)
    wrap("all_gather_into_tensor", "output_tensor", lambda output: [output])
