"""ACL104 under FSDP2: a clip that measures this rank's local shards, not the sharded model.

torch's clip functions over FSDP2's DTensor parameters all-reduce the norm, so they are right.
Code that works around DTensors by taking their local shards loses it, in two ways:

- the local shards (`p.to_local()`, `p._local_tensor`, `p.grad.to_local()`) passed to
  `clip_grad_norm_`, `clip_grad_value_` or `clip_grads_with_norm_`: a plain shard carries no
  `.grad`, so nothing is measured or clipped on any rank (the returned norm is 0);
- `torch.nn.utils.get_total_norm` over the local shards of the DTensor gradients, passed on to
  `clip_grads_with_norm_`: each rank measures its own shard, so ranks clip by different factors
  and the shards stop describing one model's step.

A local shard is a plain tensor sharing its storage with the local tensor of a DTensor parameter
(or gradient) of an optimizer the tracker watches. A norm is judged where it is used to clip: one
that `torch.distributed.all_reduce` or `broadcast` changed in place since (a max norm made global
by hand), or a new value built from the local norms with a collective, passes. Only with more
than one process (one rank's shard is the whole tensor). A clip is looked at only once FSDP has
reduce-scattered gradients (the tracker's `sharded` fact), so other loops pay nothing; then the
storage test runs only for plain tensors that are not trainable parameters, and a collective
costs one dict test.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from guard import _patch, distributed
from guard.checks._common import report

CODES = ("ACL104",)
_FIX = (
    "pass the DTensor parameters themselves: torch.nn.utils.clip_grad_norm_(model.parameters(), "
    "max_norm) (or engine.clip_grad_norm_), which all-reduces the norm over the shards"
)


class _LocalNorms:
    """Norms `get_total_norm` measured over local shards and no collective has changed since:
    id -> weak reference."""

    def __init__(self) -> None:
        self._norms: dict[int, weakref.ref] = {}

    def add(self, norm: torch.Tensor) -> None:
        self._norms = {k: ref for k, ref in self._norms.items() if ref() is not None}
        self._norms[id(norm)] = weakref.ref(norm)

    def forget(self, tensor: Any) -> None:
        """`tensor` went through a collective in place (made global by hand, e.g. a max norm)."""
        if self._norms:
            self._norms.pop(id(tensor), None)

    def local(self, norm: Any) -> bool:
        ref = self._norms.get(id(norm))
        return ref is not None and ref() is norm


def install(tracker) -> None:
    norms = _LocalNorms()

    def before_clip(kind, parameters, via, **_) -> None:
        if via != "fsdp" and _local_shards(tracker, parameters):
            _report_clips_nothing(f"torch.nn.utils.clip_grad_{kind}_")

    tracker.subscribe("clip", before_clip, when="sharded")  # a loop that never sharded pays nothing
    utils = torch.nn.utils
    get_total_norm = getattr(utils, "get_total_norm", None)
    clip_with_norm = getattr(utils, "clip_grads_with_norm_", None)
    if get_total_norm is None or clip_with_norm is None or not torch.distributed.is_available():
        return
    _patch.patch(utils, "get_total_norm", _noting(get_total_norm, tracker, norms))
    _patch.patch(utils, "clip_grads_with_norm_", _judging(clip_with_norm, tracker, norms))
    for name in ("all_reduce", "broadcast"):
        original = getattr(torch.distributed, name)
        _patch.patch(torch.distributed, name, _forgetting(original, norms))


def _as_list(tensors: Any) -> list:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _noting(original: Callable, tracker, norms: _LocalNorms) -> Callable:
    @_patch.wraps_original(original)
    def get_total_norm(tensors, *args, **kwargs):
        tensors = _as_list(tensors)  # a generator is read once, here
        norm = original(tensors, *args, **kwargs)
        if _local_shards(tracker, tensors):
            norms.add(norm)
        return norm

    return get_total_norm


def _forgetting(original: Callable, norms: _LocalNorms) -> Callable:
    @_patch.wraps_original(original)
    def collective(tensor, *args, **kwargs):
        norms.forget(tensor)
        return original(tensor, *args, **kwargs)

    return collective


def _judging(original: Callable, tracker, norms: _LocalNorms) -> Callable:
    @_patch.wraps_original(original)
    def clip_grads_with_norm_(parameters, max_norm, total_norm, *args, **kwargs):
        parameters = _as_list(parameters)
        if norms.local(total_norm) and distributed.world_size() > 1:
            _report_per_rank_norm()
        elif _local_shards(tracker, parameters):
            _report_clips_nothing("torch.nn.utils.clip_grads_with_norm_")
        return original(parameters, max_norm, total_norm, *args, **kwargs)

    return clip_grads_with_norm_


def _local_shards(tracker, tensors: list) -> bool:
    """Whether some of `tensors` are local shards of DTensors the tracker's optimizers train
    (only with more than one process)."""
    if distributed.world_size() <= 1:  # first: every clip of every loop comes here
        return False
    plain = [t for t in tensors if _maybe_shard(t)]
    if not plain:
        return False
    storages = _shard_storages(tracker)
    return any(t.untyped_storage().data_ptr() in storages for t in plain)


def _maybe_shard(tensor: Any) -> bool:
    """A plain, non-empty tensor that is not a trainable parameter (cheap: no storage read)."""
    return (
        isinstance(tensor, torch.Tensor)
        and not hasattr(tensor, "to_local")
        and not (tensor.is_leaf and tensor.requires_grad)
        and tensor.numel() > 0
    )


def _shard_storages(tracker) -> set[int]:
    """Storage addresses of the local tensors of the watched DTensor parameters and gradients."""
    found: set[int] = set()
    with torch.no_grad():
        for state in tracker.states:
            optimizer = state.ref()
            if optimizer is None:
                continue
            for group in optimizer.param_groups:
                for param in group["params"]:
                    for tensor in (param, param.grad):
                        if hasattr(tensor, "to_local"):
                            local = tensor.to_local()
                            if local.numel() > 0:
                                found.add(local.untyped_storage().data_ptr())
    return found


_VALUE_FIX = (
    "pass the DTensor parameters themselves: torch.nn.utils.clip_grad_value_(model.parameters(), "
    "clip_value) (or engine.clip_grad_value_), which clamps every shard of their gradients"
)


def _report_clips_nothing(function: str) -> None:
    value = function.endswith("clip_grad_value_")
    effect = "nothing is clipped" if value else "nothing is measured or clipped (the norm is 0)"
    report(
        "ACL104",
        f"{function} over the local shards of FSDP2's DTensor parameters or gradients "
        f"(to_local(), _local_tensor): a plain shard has no .grad, so {effect} on any rank; "
        + (_VALUE_FIX if value else _FIX),
    )


def _report_per_rank_norm() -> None:
    report(
        "ACL104",
        "torch.nn.utils.clip_grads_with_norm_ with a total norm that get_total_norm measured "
        "over this rank's local shards of FSDP2's DTensor gradients (to_local()): each rank "
        "clips by its own shard's norm, so ranks scale their shards by different factors and "
        "the update is no longer the globally clipped gradient; measure the DTensor gradients "
        "themselves (get_total_norm([p.grad for p in model.parameters()]) all-reduces), or " + _FIX,
    )
