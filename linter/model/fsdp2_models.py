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
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import CallSite, Scope

if TYPE_CHECKING:
    from linter.model import Model, TrainingLoop

_FSDP_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


@dataclass(eq=False)
class ShardedModel:
    """A name handed to `fully_shard(...)` outside any loop."""

    name: str
    call: cst.Call
    scope: Scope | None = None  # the function whose variable `name` is


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
        scope = site.stmt.scope
        if name is not None and all(m.name != name or m.scope is not scope for m in found):
            found.append(ShardedModel(name, site.call, scope))
    return found


def _holds(model: Model, text: str, scope: Scope, sharded: ShardedModel, depth: int = 0) -> bool:
    """Whether `text` in `scope` is the variable `fully_shard` sharded: the same function's, an
    enclosing function's (a free name), or a parameter this module's callers pass it to. A
    parameter called from elsewhere (`def parallelize_fn(model, mesh)` handed to a strategy) or
    another function's local of the same name is a different variable."""
    if depth > FOLLOW_DEPTH:
        return False
    if scope is sharded.scope:
        return text == sharded.name
    if _hands_in(model, text, scope, sharded):
        return True
    if text in scope.params:
        sites = model.argument_sites(scope, text)
        return any(_holds(model, dotted(e) or "", s.scope, sharded, depth + 1) for e, s in sites)
    if text in scope.defs or scope.parent is None:
        return False
    return _holds(model, text, scope.parent, sharded, depth)


def _hands_in(model: Model, text: str, scope: Scope, sharded: ShardedModel) -> bool:
    """`parallelize(model)` in `scope`, where the sharded name is `parallelize`'s parameter:
    `fully_shard` shards the caller's module in place."""
    owner = sharded.scope
    if owner is None or sharded.name not in owner.params:
        return False
    sites = model.argument_sites(owner, sharded.name)
    return any(s.scope is scope and dotted(e) == text for e, s in sites)


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
        if not _holds(model, sharded.name, loop.scope, sharded):
            continue
        forwards = forward_calls(model, calls, sharded.name)
        if forwards:
            found.append((sharded, forwards[0]))
    return found
