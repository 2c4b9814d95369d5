"""Models sharded with FSDP2's `fully_shard` (`torch.distributed.fsdp`, under any import
spelling), and which calls of a loop run their forward.

`fully_shard(model)` shards in place and returns the same module, so both `fully_shard(model)`
as a statement and `model = fully_shard(model)` make `model` an FSDP2 model. Blocks sharded
inside a loop (`for block in model.layers: fully_shard(block)`) are units of that model, not
models the loop trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import dotted, last_part, positional
from linter.model.ddp_models import _grad_free, forward_calls, loop_calls
from linter.model.functions import CallSite

if TYPE_CHECKING:
    from linter.model import Model, TrainingLoop

_FSDP_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


@dataclass(eq=False)
class ShardedModel:
    """A name handed to `fully_shard(...)` outside any loop."""

    name: str
    call: cst.Call


def is_fully_shard_call(model: Model, node: cst.CSTNode | None) -> bool:
    if not isinstance(node, cst.Call):
        return False
    qual = model.imports.qualify(node.func) or ""
    return last_part(qual) == "fully_shard" and qual.startswith(_FSDP_MODULES)


def sharded_models(model: Model) -> list[ShardedModel]:
    return model.memo("fsdp2_models", _find)


def _find(model: Model) -> list[ShardedModel]:
    found = []
    for site in model.calls:
        if not is_fully_shard_call(model, site.call) or site.stmt.loops():
            continue
        args = positional(site.call)
        name = dotted(args[0]) if args else None
        if name is not None and all(m.name != name for m in found):
            found.append(ShardedModel(name, site.call))
    return found


def sharded_in(model: Model, loop: TrainingLoop) -> list[tuple[ShardedModel, CallSite]]:
    """Each FSDP2 model whose forward runs with gradients on the loop's non-update micro-steps,
    with its first such forward call."""
    calls = [
        c
        for c in loop_calls(model, loop)
        if not _grad_free(model, c.stmt) and not model.on_update_step(loop, c.stmt)
    ]
    found = []
    for sharded in sharded_models(model):
        forwards = forward_calls(model, calls, sharded.name)
        if forwards:
            found.append((sharded, forwards[0]))
    return found
