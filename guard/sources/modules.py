"""Module sources: the events `ddp_created`, `ddp_forward`, `ddp_comm_hook` (DDP's wrapper) and
`train_mode`."""

from __future__ import annotations

import threading

from guard import _patch
from guard.events import Event
from guard.sources._hooks import installed

_local = threading.local()


def ddp(tracker) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if installed(DDP, "forward"):
        return
    init, forward, register_hook = DDP.__init__, DDP.forward, DDP.register_comm_hook

    @_patch.wraps_original(init)
    def __init__(module, *args, **kwargs):
        init(module, *args, **kwargs)
        tracker.establish("ddp")
        tracker.emit(Event.DDP_CREATED, module=module)

    @_patch.wraps_original(forward)
    def guarded_forward(module, *args, **kwargs):
        tracker.establish("ddp")  # also a wrapper built before the guard was installed
        if torch.is_grad_enabled():
            sync = bool(getattr(module, "require_backward_grad_sync", True))
            tracker.emit(Event.DDP_FORWARD, module=module, sync=sync)
        return forward(module, *args, **kwargs)

    @_patch.wraps_original(register_hook)
    def register_comm_hook(module, state, hook):
        result = register_hook(module, state, hook)
        tracker.emit(Event.DDP_COMM_HOOK, module=module, hook=hook)
        return result

    _patch.patch(DDP, "__init__", __init__)
    _patch.patch(DDP, "forward", guarded_forward)
    _patch.patch(DDP, "register_comm_hook", register_comm_hook)


def train_mode(tracker) -> None:
    import torch

    if installed(torch.nn.Module, "train"):
        return
    original = torch.nn.Module.train

    @_patch.wraps_original(original)
    def train(module, mode: bool = True):
        depth = getattr(_local, "train_depth", 0)
        _local.train_depth = depth + 1
        try:
            result = original(module, mode)
        finally:
            _local.train_depth = depth
        if depth == 0 and isinstance(mode, bool):
            tracker.emit(Event.TRAIN_MODE, module=module, mode=mode)
        return result

    _patch.patch(torch.nn.Module, "train", train)
