"""Distributed facts, a facade over four topic modules: DDP-wrapped models (`ddp_models`), their
`no_sync` regions and sync toggles (`ddp_sync`), world-size expressions (`world_size`), and
`DistributedSampler`s with the loaders and epoch loops that use them (`samplers`).

Names resolve as Python does (the function's own assignments, the arguments its callers pass,
the enclosing function, `self.<attr>` of the same class), so a `train(model, ...)` helper sees
the DDP model its caller built. Facts are built once per module through `model.memo`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from linter.model.cst_util import code
from linter.model.ddp_models import (
    DDPModel,
    calls_handed,
    ddp_held_by,
    ddp_models,
    ddp_models_in,
    forward_calls,
    inside,
    loop_calls,
    module_calls,
    prepared_models_in,
    wrapped_on_every_path,
)
from linter.model.ddp_sync import (
    has_comm_hook,
    mentions_sync_control,
    never_true_on_step,
    no_sync_regions,
    range_index,
    reduces_gradients_by_hand,
    sync_toggles,
    syncs_each_batch,
)
from linter.model.samplers import (
    EpochLoop,
    epoch_loops,
    prepared_by_engine,
    sets_epoch,
    shuffling_samplers,
    step_sites,
)
from linter.model.world_size import world_size_divisions

__all__ = [
    "DDPModel",
    "calls_handed",
    "ddp_held_by",
    "ddp_models",
    "ddp_models_in",
    "prepared_models_in",
    "describe",
    "epoch_loops",
    "forward_calls",
    "has_comm_hook",
    "inside",
    "loop_calls",
    "mentions_sync_control",
    "module_calls",
    "never_true_on_step",
    "no_sync_regions",
    "prepared_by_engine",
    "range_index",
    "reduces_gradients_by_hand",
    "sets_epoch",
    "shuffling_samplers",
    "step_sites",
    "sync_toggles",
    "syncs_each_batch",
    "world_size_divisions",
    "wrapped_on_every_path",
]

if TYPE_CHECKING:
    from linter.model import Model, TrainingLoop


# --show-loops -----------------------------------------------------------------------------
def describe(model: Model, loop: TrainingLoop) -> dict:
    """What the distributed rules understood about one training loop."""
    ddp = [
        {
            "name": held.name,
            "line": model.line(held.call),
            "forward_line": model.line(forward.call),
            "wrapped_on_every_path": wrapped_on_every_path(model, held),
        }
        for held, forward in ddp_models_in(model, loop)
    ]
    return {
        "ddp_models": ddp,
        "sync_control": mentions_sync_control(model, loop),
        "samplers": _samplers_of(model, loop),
    }


def _samplers_of(model: Model, loop: TrainingLoop) -> list[dict]:
    found = []
    for sampler in shuffling_samplers(model):
        epochs = []
        for loader in sampler.loaders:
            for epoch in epoch_loops(model, loader):
                if _runs_within(loop, epoch):
                    told = sets_epoch(model, epoch.outer, epoch.scope, set()) or (
                        epoch.helper is not None
                        and sets_epoch(model, epoch.helper.node, epoch.helper, set())
                    )
                    epochs.append({"line": model.line(epoch.node), "set_epoch": told})
        if epochs:
            found.append(
                {
                    "name": sampler.name or code(sampler.call),
                    "line": model.line(sampler.call),
                    "loaders": list(sampler.loaders),
                    "epoch_loops": epochs,
                }
            )
    return found


def _runs_within(loop: TrainingLoop, epoch: EpochLoop) -> bool:
    """The training loop is the pass of this epoch loop (inside it, or its helper)."""
    if epoch.helper is loop.scope:
        return True
    return any(
        f.node is epoch.node for s in loop.scope.stmts if inside(s, loop.node) for f in s.frames
    )
