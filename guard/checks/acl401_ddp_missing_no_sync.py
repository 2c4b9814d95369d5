"""ACL401 (performance warning) and ACL405 (error): how often a DDP model's gradients were
all-reduced during one optimizer step's window.

DDP decides during forward whether the coming backward all-reduces (`require_backward_grad_sync`,
False under `no_sync()`), so the guard counts synced forwards (with gradients enabled) of each
DDP model between steps of the optimizers that own its parameters. More than one synced forward
in a window of several micro-batches is wasted communication (ACL401). Backward passes with no
synced forward at all mean the replicas step on local gradients and diverge (ACL405: forward
through `model.module`, a sync flag that stays False, `no_sync()` around the stepping
micro-step); that is raised before the step. Only with more than one process. A window whose
extra all-reduces came from a model left out of `accelerator.accumulate()` is ACL309's finding
(reported at the forward, naming the model), so ACL401 stays silent for it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from guard import sources
from guard.checks._common import first_params, report

CODES = ("ACL401", "ACL405")


@dataclass
class Syncs:
    """ACL401/405's count of one DDP-trained optimizer's window (`OptState.of`)."""

    synced: int = 0  # synced DDP forwards in this window
    synced_at: int | None = None  # the backward counter when the last one was counted
    trains_ddp: bool | None = None  # its parameters belong to a DDP model (None: not asked)


def install(tracker) -> None:
    sources.ensure(tracker, "ddp")
    ddp_modules: weakref.WeakSet = weakref.WeakSet()

    def created(module, **_) -> None:
        ddp_modules.add(module)

    def forward(module, sync, **_) -> None:
        ddp_modules.add(module)
        if sync:
            for st in tracker.owners(first_params(module)):
                syncs = st.of(Syncs)
                if syncs.synced_at != tracker.backward_id:  # once per micro-step:
                    syncs.synced_at = tracker.backward_id  # two DDP models, one backward
                    syncs.synced += 1

    def before_step(optimizer, state, **_) -> None:
        reported = state.silenced_by("ACL401") is not None  # ACL309's finding, this window
        if state.backwards and _world_size() > 1 and _trains_ddp(state, optimizer, ddp_modules):
            _judge_window(state, extra_syncs_reported=reported)
        state.of(Syncs).synced = 0

    def scaler_step(state, ran, **_) -> None:  # a skipped step ends the window too
        if not ran:
            state.of(Syncs).synced = 0

    tracker.subscribe("ddp_created", created)
    tracker.subscribe("ddp_forward", forward)
    tracker.subscribe("optimizer_step_pre", before_step, when="ddp")
    tracker.subscribe("scaler_step", scaler_step, when="ddp")


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _trains_ddp(state, optimizer, ddp_modules) -> bool:
    """Whether the optimizer's parameters belong to a DDP model (computed once per optimizer)."""
    syncs = state.of(Syncs)
    if syncs.trains_ddp is None:
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        syncs.trains_ddp = any(id(p) in owned for m in list(ddp_modules) for p in m.parameters())
    return syncs.trains_ddp


def _judge_window(state, extra_syncs_reported: bool) -> None:
    synced = state.of(Syncs).synced
    k = state.backwards
    if synced == 0:
        report(
            "ACL405",
            f"{k} backward pass(es) reached this step of a DDP model's optimizer, but none ran "
            "after a DDP forward with gradient sync on: the gradients were never all-reduced and "
            "the replicas diverge; call the DDP wrapper (model(x), not model.module(x)) and let "
            "the micro-step that steps run outside no_sync()",
        )
    elif synced > 1 and k > 1 and not extra_syncs_reported and not _accelerate_syncs_each_batch():
        report(
            "ACL401",
            f"{synced} of the {k} micro-batches of this optimizer step all-reduced their "
            f"gradients; only the last one needs to: run forward and backward of the first "
            f"{k - 1} under `with model.no_sync():` (DDP reads the flag in forward) or use "
            "accelerator.accumulate()",
            level="warning",
        )


def _accelerate_syncs_each_batch() -> bool:
    import sys

    state_mod = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state_mod, "GradientState", None), "_shared_state", {}) or {}
    plugin = shared.get("plugin_kwargs") or {}
    return bool(plugin.get("sync_each_batch", False))
