"""Event sources the accumulation, DDP and evaluation checks need beyond the tracker's own.

They follow the tracker's rules: each patch goes through `guard._patch` (so `uninstall()` restores
it) and only emits an event; the checks subscribe. `ensure(tracker, name, ...)` installs a source
once per installation. Events (payloads as keyword arguments):

- `loader_start(iterator)`: a torch DataLoader iterator produced its first batch (a pass over
  the loader began). Accelerate's prepared loaders fetch one batch ahead through the same
  iterator. There is no event per batch: `LOADERS` counts them (see `LoaderProgress`).
- `loader_end(iterator)`: that iterator is exhausted (its pass over the loader ended).
- `sampler_iter(sampler)`: a `DistributedSampler` starts a pass.
- `sampler_end(sampler, epoch)`: that pass handed out all its indices; `epoch` is the one its
  order was drawn with. A pass abandoned early (a peek such as `next(iter(loader))`) never
  ends, so it is not judged as an epoch.
- `ddp_created(module)`: a `DistributedDataParallel` wrapper was built.
- `ddp_forward(module, sync)`: a DDP forward with gradients enabled; `sync` is the wrapper's
  `require_backward_grad_sync` (False under `no_sync()`), read when DDP reads it.
- `train_mode(module, mode)`: the outermost `Module.train(mode)` / `Module.eval()` call.
- `gather(accelerator, result)`: the user's `Accelerator.gather` call (not one made by
  `gather_for_metrics`) returned `result`.
- `dist_gather(parts)`: user code (not torch, Accelerate or the guard) called
  `torch.distributed.all_gather` / `all_gather_into_tensor` / `all_gather_object`; `parts` is
  the output list (one entry per rank) or `[output_tensor]`.
- `deprecated_amp(api, replacement)`: user code (not a library) constructed a deprecated AMP
  class such as `torch.cuda.amp.GradScaler(...)`; `replacement` is its `torch.amp` spelling.
- `finish()`: the run is ending, before the guard writes its report (end-of-run checks).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from guard import _install, _patch, _report
from guard.events import Event

_local = threading.local()


def ensure(tracker, *names: str) -> None:
    """Install the named sources (idempotent while the guard stays installed)."""
    for name in names:
        _SOURCES[name](tracker)


def _called_by_user() -> bool:
    """Whether the function calling a wrapper (the wrapper calls this) is the user's code, not
    torch's, Accelerate's or the guard's."""
    return not _report._is_internal(sys._getframe(2).f_code.co_filename)


def _installed(owner: Any, attribute: str) -> bool:
    return hasattr(getattr(owner, attribute, None), "__guard_original__")


class LoaderPass:
    """One pass over a DataLoader (kept after its iterator is gone)."""

    finished = False  # its iterator was exhausted


class LoaderProgress:
    """What the DataLoader source records per batch, for checks to read when they need it.

    A subscriber per batch would run on every micro-step of every loop; these fields cost the
    loop almost nothing and answer the checks' questions: has a batch been fetched since, which
    pass fed this step, did that pass end.
    """

    def __init__(self) -> None:
        self.fetched = 0  # batches produced, plus one per exhausted pass (Accelerate's prepared
        #                   loaders yield their last batch when the inner one is exhausted)
        self.latest_pass: LoaderPass | None = None  # the pass of the latest batch
        self._latest: weakref.ref | None = None  # the iterator of the latest batch
        self._passes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # iterator -> pass

    def latest(self) -> Any:
        """The DataLoader iterator that produced the latest batch (None if gone or none yet)."""
        return self._latest() if self._latest is not None else None

    def batch(self, iterator) -> bool:
        """Count a batch of `iterator`; True when it is the iterator's first."""
        self.fetched += 1
        latest = self._latest
        if latest is not None and latest() is iterator:
            return False  # the usual case: the same pass goes on
        self._latest = weakref.ref(iterator)
        current = self._passes.get(iterator)
        first = current is None
        if first:
            current = self._passes[iterator] = LoaderPass()
        self.latest_pass = current
        return first

    def ended(self, iterator) -> None:
        self.fetched += 1
        current = self._passes.get(iterator)
        if current is not None:
            current.finished = True


LOADERS = LoaderProgress()


def _loader(tracker) -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    if _installed(_BaseDataLoaderIter, "__next__"):
        return
    global LOADERS
    LOADERS = progress = LoaderProgress()  # a new installation starts counting afresh
    original = _BaseDataLoaderIter.__next__

    @_patch.wraps_original(original)
    def __next__(iterator):
        try:
            batch = original(iterator)
        except StopIteration:
            progress.ended(iterator)
            tracker.emit(Event.LOADER_END, iterator=iterator)
            raise
        if progress.batch(iterator):
            tracker.emit(Event.LOADER_START, iterator=iterator)
        return batch

    _patch.patch(_BaseDataLoaderIter, "__next__", __next__)


def _sampler(tracker) -> None:
    from torch.utils.data.distributed import DistributedSampler

    if _installed(DistributedSampler, "__iter__"):
        return
    original = DistributedSampler.__iter__

    @_patch.wraps_original(original)
    def __iter__(sampler):
        tracker.emit(Event.SAMPLER_ITER, sampler=sampler)
        indices = original(sampler)
        if not tracker.wants(Event.SAMPLER_END):
            return indices
        return _until_end(tracker, sampler, getattr(sampler, "epoch", None), indices)

    _patch.patch(DistributedSampler, "__iter__", __iter__)


def _until_end(tracker, sampler, epoch, indices):
    """The pass's indices, then `sampler_end` once they are all handed out."""
    yield from indices
    tracker.emit(Event.SAMPLER_END, sampler=sampler, epoch=epoch)


def _ddp(tracker) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if _installed(DDP, "forward"):
        return
    init, forward = DDP.__init__, DDP.forward

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

    _patch.patch(DDP, "__init__", __init__)
    _patch.patch(DDP, "forward", guarded_forward)


def _train_mode(tracker) -> None:
    import torch

    if _installed(torch.nn.Module, "train"):
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


def _gather(tracker) -> None:
    def patch_accelerate(_module) -> None:
        from accelerate import Accelerator

        if _installed(Accelerator, "gather"):
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


def _dist_gather(tracker) -> None:

    import torch.distributed as dist

    if not dist.is_available() or _installed(dist, "all_gather"):
        return

    def wrap(name: str, keyword: str, output_parts: Callable[[Any], list]) -> None:
        original = getattr(dist, name)

        @_patch.wraps_original(original)
        def all_gather_(*args, **kwargs):  # torch.distributed.checkpoint passes keywords
            result = original(*args, **kwargs)
            if _called_by_user():
                output = args[0] if args else kwargs.get(keyword)
                tracker.emit(Event.DIST_GATHER, parts=output_parts(output))
            return result

        _patch.patch(dist, name, all_gather_)

    wrap("all_gather", "tensor_list", list)
    wrap("all_gather_object", "object_list", list)
    wrap("all_gather_into_tensor", "output_tensor", lambda output: [output])


_finish_hooked: list = []


def _finish(tracker) -> None:
    """One exit hook per process; it reaches whichever checks are subscribed at exit time."""
    if not _finish_hooked:
        _finish_hooked.append(True)
        _report.before_exit(lambda: tracker.emit(Event.FINISH) if tracker.active else None)


DEPRECATED_AMP = {  # module path -> class names whose torch.amp spelling takes the device first
    "torch.cuda.amp": ("autocast", "GradScaler"),
    "torch.cpu.amp": ("autocast", "GradScaler"),
}


def _deprecated_amp(tracker) -> None:
    import importlib

    for module_name, class_names in DEPRECATED_AMP.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a torch without the old namespace: nothing deprecated to catch
            continue
        for class_name in class_names:
            cls = getattr(module, class_name, None)
            if cls is not None and not _installed(cls, "__init__"):
                _wrap_deprecated_init(tracker, cls, f"{module_name}.{class_name}")


def _wrap_deprecated_init(tracker, cls: type, api: str) -> None:
    original = cls.__dict__.get("__init__", cls.__init__)
    device = api.split(".")[1]
    replacement = f"torch.amp.{cls.__name__}({device!r}, ...)"

    @_patch.wraps_original(original)
    def __init__(self, *args, **kwargs):
        if _called_by_user():
            tracker.emit(Event.DEPRECATED_AMP, api=api, replacement=replacement)
        original(self, *args, **kwargs)

    _patch.patch(cls, "__init__", __init__)


_SOURCES: dict[str, Callable[[Any], None]] = {
    "loader": _loader,
    "sampler": _sampler,
    "ddp": _ddp,
    "train_mode": _train_mode,
    "gather": _gather,
    "dist_gather": _dist_gather,
    "finish": _finish,
    "deprecated_amp": _deprecated_amp,
}
