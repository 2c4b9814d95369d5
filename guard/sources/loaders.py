"""DataLoader and DistributedSampler sources: the events `loader_start`, `loader_end`,
`sampler_iter` and `sampler_end`, and `LOADERS`, the per-batch count read instead of an event
per batch."""

from __future__ import annotations

import weakref
from typing import Any

from guard import _patch
from guard.events import Event
from guard.sources._hooks import installed


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


def loader(tracker) -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    if installed(_BaseDataLoaderIter, "__next__"):
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


def sampler(tracker) -> None:
    from torch.utils.data.distributed import DistributedSampler

    if installed(DistributedSampler, "__iter__"):
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
