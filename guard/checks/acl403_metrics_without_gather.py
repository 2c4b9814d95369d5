"""ACL403 (warning): an evaluation pass gathers more samples than its dataset holds.

With several processes, a prepared loader (and a `DistributedSampler` with `drop_last=False`)
pads the last global batch with repeated samples so that every process runs the same number of
batches; `accelerator.gather` and `torch.distributed.all_gather*` keep them, while
`gather_for_metrics` drops them. Per evaluation pass (no backward since it began) the guard sums
the samples the user gathered: the leading dimension of each gathered value, taken once per batch
(gathering preds and labels separately, or as a pair, counts each sample once). A pass whose
dataset left padding in the last batch and whose total exceeds the dataset's length is reported
at its end: for a prepared loader at the gather on its last batch, for a plain loader over a
`DistributedSampler` when the loop exhausts it (before anything after the loop runs).
Gathered scalars (a loss per batch) count one per rank and so stay well below the dataset length.
A loop that truncates the gathered tail itself (`preds[: len(dataset) - seen]`, as in an older
Accelerate example) is correct but looks the same at runtime: hence a warning.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from guard import sources
from guard.checks._common import report
from guard.sources import loaders

CODES = ("ACL403",)


@dataclass
class _Pass:
    """The samples gathered so far in one pass over an evaluation loader."""

    dataset_length: int
    padded: int  # repeated samples in the last global batch
    first_backward: int  # the tracker's backward counter when the pass began
    samples: int = 0  # summed over the finished batches
    batch: int = -1  # which batch the current gathers belong to
    batch_samples: int = 0  # the largest gather of that batch
    judged: bool = False

    def add(self, batch: int, samples: int) -> None:
        if batch != self.batch:
            self.samples += self.batch_samples
            self.batch, self.batch_samples = batch, 0
        self.batch_samples = max(self.batch_samples, samples)

    def total(self) -> int:
        return self.samples + self.batch_samples


def install(tracker) -> None:
    sources.ensure(tracker, "gather", "dist_gather", "loader", "sampler")
    progress = loaders.LOADERS
    # id(prepared loader) -> (the loader, weakly; its iteration; _Pass): ids of gone loaders
    # are reused, and a new loader must not inherit a finished pass
    prepared: dict = {}
    sampled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # torch iterator -> _Pass
    current: dict = {"sampler": None}  # (DistributedSampler, batches fetched before its pass)

    def first_batch(iterator, **_) -> None:
        started, current["sampler"] = current["sampler"], None
        # a DistributedSampler starts right before its loader's first batch, none in between
        if started is not None and started[1] == progress.fetched - 1:
            sampled[iterator] = _sampler_pass(started[0], tracker.backward_id)

    def sampler_started(sampler, **_) -> None:
        current["sampler"] = (sampler, progress.fetched)

    def accelerate_gathered(accelerator, result, **_) -> None:
        state = accelerator.gradient_state
        loader = state.active_dataloader
        if loader is None or getattr(accelerator, "num_processes", 1) < 2:
            return
        iteration = getattr(loader, "iteration", 0)
        seen = prepared.get(id(loader))
        if seen is None or seen[0]() is not loader or seen[1] != iteration:
            evaluation = _prepared_pass(loader, state, tracker)
            seen = prepared[id(loader)] = (weakref.ref(loader), iteration, evaluation)
        evaluation = seen[2]
        if evaluation is not None:
            evaluation.add(progress.fetched, _tensor_samples(result))
            if state.end_of_dataloader:
                _judge(evaluation, tracker, accelerator.num_processes)

    def dist_gathered(parts, **_) -> None:
        iterator = progress.latest()
        evaluation = sampled.get(iterator) if iterator is not None else None
        if evaluation is not None:
            evaluation.add(progress.fetched, sum(_object_samples(p) for p in parts))

    def pass_ended(iterator, **_) -> None:
        evaluation = sampled.pop(iterator, None)
        if evaluation is not None:
            _judge(evaluation, tracker, _world_size())

    tracker.subscribe("loader_start", first_batch)
    tracker.subscribe("loader_end", pass_ended)
    tracker.subscribe("sampler_iter", sampler_started)
    tracker.subscribe("gather", accelerate_gathered)
    tracker.subscribe("dist_gather", dist_gathered)


def _prepared_pass(loader, state, tracker) -> _Pass | None:
    """A pass over a prepared loader whose last global batch is padded: its dataset length is
    known and leaves a remainder (`state.remainder` > 0 real samples in that batch); else None."""
    remainder = getattr(state, "remainder", -1)
    total_batch = getattr(loader, "total_batch_size", None)
    if remainder is None or remainder <= 0 or not total_batch:
        return None
    try:
        length = int(getattr(loader, "total_dataset_length", None) or len(loader.dataset))
    except (TypeError, AttributeError, NotImplementedError):
        return None
    return _Pass(length, total_batch - remainder, tracker.backward_id)


def _sampler_pass(sampler, backward_id: int) -> _Pass | None:
    """A pass over a DistributedSampler that pads to `total_size` (it does unless it drops the
    tail); else None."""
    try:
        length = len(sampler.dataset)
    except (TypeError, AttributeError, NotImplementedError):
        return None
    padded = int(getattr(sampler, "total_size", length)) - length
    return _Pass(length, padded, backward_id) if padded > 0 else None


def _judge(evaluation: _Pass, tracker, world: int) -> None:
    if evaluation.judged:
        return
    evaluation.judged = True
    total = evaluation.total()
    if evaluation.first_backward == tracker.backward_id and total > evaluation.dataset_length:
        _report(evaluation, total, world)


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _tensor_samples(value: Any) -> int:
    """The leading dimension of the first tensor in a gathered structure (0-d: one per rank)."""
    if isinstance(value, torch.Tensor):
        return value.shape[0] if value.dim() else 1
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            samples = _tensor_samples(item)
            if samples:
                return samples
    return 0


def _object_samples(value: Any) -> int:
    """Samples in one rank's gathered object: a tensor's leading dimension, a list's length, the
    first entry of a tuple or dict (a (preds, labels) pair counts once), else one."""
    if hasattr(value, "shape"):
        return value.shape[0] if len(value.shape) else 1
    if isinstance(value, Mapping):
        return _object_samples(next(iter(value.values()))) if value else 0
    if isinstance(value, tuple):
        return _object_samples(value[0]) if value else 0
    if isinstance(value, list):
        return len(value)
    return 1


def _report(evaluation: _Pass, total: int, world: int) -> None:
    report(
        "ACL403",
        f"this evaluation pass gathered {total} samples for a dataset of "
        f"{evaluation.dataset_length}: the last batch carries {evaluation.padded} repeated "
        f"sample(s) padded in so that {world} processes get equal batches, and the gather kept "
        "them, so metrics count them unless the loop truncates them itself; use "
        "accelerator.gather_for_metrics(...), which drops them (in plain torch.distributed, "
        "keep only the first len(dataset) gathered samples)",
        level="warning",
    )
