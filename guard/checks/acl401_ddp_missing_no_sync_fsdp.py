"""ACL401 (performance warning) and ACL405 (error) for sharded models (FSDP2 `fully_shard`, and
FSDP1), counted from the collectives.

- ACL401: FSDP reduce-scatters a unit's gradients in every backward unless its gradient sync is
  off (`model.set_requires_gradient_sync(False)` in FSDP2, `model.no_sync()` in FSDP1). The
  guard wraps `torch.distributed.reduce_scatter_single` / `reduce_scatter_tensor`, marks each
  backward pass during which one was issued (FSDP's post-backward hooks), and at the
  optimizer's step counts the marked passes of its window: more than one is K-fold
  communication for the same update.
- ACL405: a GradScaler must skip a step on every rank or on none. Each rank sees only its shard
  of the gradients, so a scaler that checks them for inf/NaN rank by rank (torch.amp.GradScaler
  on FSDP1's flat shards; FSDP2's DTensor gradients reduce the flag themselves) lets one rank
  step while another skips, and the shards stop describing one model. After each
  `scaler.step` of an optimizer that trains sharded parameters the guard all-reduces whether
  it stepped (one 2-element collective per optimizer step, only with more than one process).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from guard import _patch, distributed
from guard.checks._common import report
from guard.checks.acl401_ddp_missing_no_sync import _accelerate_syncs_each_batch

CODES = ("ACL401", "ACL405")


@dataclass
class Sharded:
    """What ACL401/405 know of an optimizer of sharded parameters (`OptState.of`)."""

    reduced: int = 0  # backward passes of this window that FSDP reduce-scattered
    trains_shards: bool | None = None  # whether it trains sharded parameters (None: not asked)


class _Marks:
    """The backward pass during which FSDP last reduce-scattered (by tracker.backward_id), and
    whether the per-window counting is subscribed (from the first FSDP reduce-scatter on, so
    loops without FSDP pay nothing per micro-step)."""

    backward_id = -1
    counting = False


def install(tracker) -> None:
    marks = _Marks()

    def backward(states, **_) -> None:
        if marks.backward_id == tracker.backward_id:
            for st in states:
                st.of(Sharded).reduced += 1

    def before_step(state, **_) -> None:  # also at a step the scaler skips: the window ends
        sharded = state.of(Sharded)
        reduced, sharded.reduced = sharded.reduced, 0
        if reduced > 1 and distributed.world_size() > 1 and not _accelerate_syncs_each_batch():
            _report_every_micro_step(reduced)

    def start_counting() -> None:
        marks.counting = True
        tracker.establish("sharded")
        tracker.subscribe("backward", backward)
        tracker.subscribe("optimizer_step_pre", before_step)

    def scaler_step(optimizer, state, ran, **_) -> None:
        if not ran and marks.counting:
            before_step(state)
        if distributed.world_size() > 1 and _trains_sharded(state, optimizer):
            _judge_skip_agreement(ran)

    _wrap_reduce_scatters(tracker, marks, start_counting)
    tracker.subscribe("scaler_step", scaler_step, when="scaled")


def _wrap_reduce_scatters(tracker, marks: _Marks, start_counting) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        original = getattr(dist, name, None)
        if original is None or hasattr(original, "__guard_original__"):
            continue
        _patch.patch(dist, name, _marking(original, tracker, marks, start_counting))


def _marking(original, tracker, marks: _Marks, start_counting):
    @_patch.wraps_original(original)
    def reduce_scatter(*args, **kwargs):
        if tracker.backward_depth:  # FSDP's post-backward hooks (no one else, in practice)
            marks.backward_id = tracker.backward_id
            if not marks.counting:
                start_counting()
        return original(*args, **kwargs)

    return reduce_scatter


def _report_every_micro_step(reduced: int) -> None:
    report(
        "ACL401",
        f"{reduced} backward passes of this optimizer step reduce-scattered a sharded model's "
        "gradients; only the last micro-batch needs to: call "
        "model.set_requires_gradient_sync(False) before the others (FSDP2; FSDP1: run them "
        "under model.no_sync()) and True again before the last, or use accelerator.accumulate() "
        "/ engine.accumulate()",
        level="warning",
    )


def _trains_sharded(state, optimizer) -> bool:
    sharded = state.of(Sharded)
    if sharded.trains_shards is None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        sharded.trains_shards = any(_is_shard(p) for p in params)
    return sharded.trains_shards


def _is_shard(param) -> bool:
    """A DTensor (FSDP2) or an FSDP1 flat parameter (whose gradient holds one rank's shard)."""
    if hasattr(param, "to_local"):
        return True
    fsdp = sys.modules.get("torch.distributed.fsdp")  # no flat parameter before it is imported
    return fsdp is not None and isinstance(param, fsdp.FlatParameter)


def _judge_skip_agreement(ran: bool) -> None:
    import torch.distributed as dist

    flags = torch.tensor([float(ran), float(not ran)], device=distributed.collective_device())
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    stepped_somewhere, skipped_somewhere = flags.tolist()
    if stepped_somewhere and skipped_somewhere:
        here = "stepped" if ran else "skipped the step"
        report(
            "ACL405",
            f"the GradScaler skipped this step on some ranks and stepped on others (this rank "
            f"{here}): each rank checked only its own shard of the gradients for inf/NaN, so "
            "the shards were updated by different steps and no longer form one model; use "
            "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler with FSDP1 (FSDP2's "
            "DTensor gradients need only torch.amp.GradScaler)",
        )
