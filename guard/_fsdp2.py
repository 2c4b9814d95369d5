"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for `guard.Engine`.

The engine keeps its DDP semantics (loss / N, the tail window, `num_items`) and only swaps the
mechanics, which live here so that `engine.py` stays one branch per concern:

- sharding: `fully_shard` on each block chosen by the plugin's policy, then on the root, with a
  `MixedPrecisionPolicy(param_dtype=bf16|fp16, reduce_dtype=fp32)` for the engine's precision;
- accumulation: `set_requires_gradient_sync(False)` on non-sync micro-steps (FSDP2's `no_sync`),
  so gradients are reduce-scattered once per optimizer step;
- gradients are DTensors: the engine rescales their local shards in place, and reports the
  clipped norm as a plain tensor (torch's `clip_grad_norm_` over DTensors already all-reduces it);
- checkpoints: `torch.distributed.checkpoint` with the sharded model and optimizer state dicts.

A GradScaler needs nothing extra: torch's found-inf check over DTensor gradients reduces the
flag across the shards' ranks, so every rank skips the same steps (the guard checks that).
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from guard.engine import Engine

WrapPolicy = Callable[[torch.nn.Module], bool] | type | tuple[type, ...] | None
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class FSDP2Plugin:
    """How `guard.Engine(fsdp_plugin=...)` shards a prepared model (field names follow
    Accelerate's `FullyShardedDataParallelPlugin`).

    Args:
        auto_wrap_policy: which submodules become their own FSDP2 unit (one all-gather and one
            reduce-scatter each), before the root is sharded: a module class (or a tuple of
            them), a predicate `policy(module) -> bool`, or None: every module held in an
            `nn.ModuleList` (the usual transformer `layers`/`blocks`).
        reshard_after_forward: free the gathered parameters after forward (memory) or keep them
            until backward (one all-gather fewer per unit and micro-step); None: torch's default
            (True for the blocks, the root keeps its parameters, which backward needs first).
    """

    auto_wrap_policy: WrapPolicy = None
    reshard_after_forward: bool | None = None


def resolve(plugin: Any) -> FSDP2Plugin | None:
    """The engine's `fsdp_plugin` argument: None, True / "fsdp2" (defaults) or a plugin."""
    if plugin is None or plugin is False:
        return None
    if plugin is True or plugin == "fsdp2":
        return FSDP2Plugin()
    if isinstance(plugin, FSDP2Plugin):
        return plugin
    raise TypeError(f"fsdp_plugin must be a guard.FSDP2Plugin, True or None, not {plugin!r}")


def is_sharded(model: Any) -> bool:
    """Whether `model` is an FSDP2 module (cheap when FSDP was never imported)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def shard(model: torch.nn.Module, plugin: FSDP2Plugin, precision: str) -> torch.nn.Module:
    """`fully_shard` the policy's blocks (innermost first), then the root; returns the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if precision in _DTYPES:
        policy = MixedPrecisionPolicy(param_dtype=_DTYPES[precision], reduce_dtype=torch.float32)
    options: dict[str, Any] = {"mp_policy": policy}
    if plugin.reshard_after_forward is not None:
        options["reshard_after_forward"] = plugin.reshard_after_forward
    before = dict(model.named_parameters())
    for block in reversed(_blocks(model, plugin.auto_wrap_policy)):  # children before parents
        fully_shard(block, **options)
    fully_shard(model, **options)
    after = dict(model.named_parameters())
    _replaced[model] = {id(p): (weakref.ref(p), after[name]) for name, p in before.items()}
    return model


# fully_shard replaces each parameter by a new DTensor parameter: sharded model -> {id(old
# parameter): (weak reference to it, its sharded replacement)}, for optimizers built before.
_replaced: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def adopt_sharded_parameters(optimizers: Iterable[Any]) -> None:
    """Point optimizers built on the unsharded model at its sharded parameters (as Accelerate
    does under FSDP2); the guard's tracker then watches the new parameters."""
    from guard._tracker import TRACKER

    table = {key: pair for mapping in _replaced.values() for key, pair in mapping.items()}
    for optimizer in optimizers:
        inner = getattr(optimizer, "optimizer", optimizer)
        groups = [[_sharded(table, p) for p in g["params"]] for g in inner.param_groups]
        changed = any(
            new is not old
            for params, group in zip(groups, inner.param_groups, strict=True)
            for new, old in zip(params, group["params"], strict=True)
        )
        if changed and inner.state:
            raise ValueError("prepare the model and its optimizer before the optimizer steps")
        for params, group in zip(groups, inner.param_groups, strict=True):
            group["params"] = params
        state = TRACKER.optimizers.get(inner) if TRACKER.active else None
        if changed and state is not None:
            TRACKER._watch(inner, state)


def _sharded(table: dict, param: Any) -> Any:
    pair = table.get(id(param))
    return pair[1] if pair is not None and pair[0]() is param else param


def _blocks(model: torch.nn.Module, policy: WrapPolicy) -> list[torch.nn.Module]:
    """The submodules (root excluded) the policy selects, in `model.modules()` order."""
    if policy is None:
        lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        chosen = {id(block) for lst in lists for block in lst}
        return [m for m in model.modules() if id(m) in chosen and m is not model]
    if isinstance(policy, type) or isinstance(policy, tuple):
        return [m for m in model.modules() if m is not model and isinstance(m, policy)]
    return [m for m in model.modules() if m is not model and policy(m)]


@contextlib.contextmanager
def _without_gradient_sync(model: Any):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def no_sync(model: Any) -> contextlib.AbstractContextManager:
    """DDP's `no_sync()`, FSDP2's sync switch turned off for the block, or nothing."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    if is_sharded(model):
        return _without_gradient_sync(model)
    return contextlib.nullcontext()


def syncs_gradients(model: Any) -> bool:
    """Whether the engine must switch this model's gradient sync off on non-sync micro-steps."""
    return isinstance(model, torch.nn.parallel.DistributedDataParallel) or is_sharded(model)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (sharing its storage), any other tensor unchanged."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def plain_norm(norm: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor norm (torch's clip over DTensors) as an ordinary tensor."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def refuse_mid_window() -> None:
    raise RuntimeError(
        "guard.Engine under FSDP2 cannot save in the middle of an accumulation window: FSDP2 "
        "holds the window's unsharded gradients itself until the sync micro-step; save after "
        "optimizer.step() on a sync step (engine.sync_gradients is True)"
    )


# ------------------------------------------------------------------------------ checkpoints
def _owner(engine: Engine, optimizer: Any) -> torch.nn.Module:
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for model in engine._models:
        if any(id(p) in owned for p in model.parameters()):
            return model
    raise ValueError("an optimizer prepared by the engine trains none of its prepared models")


def _optimizer_state(engine: Engine, prepared: Any) -> dict[str, Any]:
    """torch's sharded optimizer state dict. For an optimizer that has not stepped yet, torch
    takes one step with zero gradients and lr 0 to create its state: that step is marked as the
    prepared optimizer's own, so the guard does not take it for the user's."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from guard._tracker import TRACKER

    model = _owner(engine, prepared)
    if not TRACKER.active:
        return get_optimizer_state_dict(model, prepared.optimizer)
    with TRACKER.flag("step_wrapper", prepared):
        return get_optimizer_state_dict(model, prepared.optimizer)


def _state(engine: Engine) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {
        "models": {str(i): get_model_state_dict(m) for i, m in enumerate(engine._models)},
        "optimizers": {
            str(i): _optimizer_state(engine, o) for i, o in enumerate(engine._optimizers)
        },
        "schedulers": {str(i): s.state_dict() for i, s in enumerate(engine._schedulers)},
        "engine": engine.state_dict(),
    }


def save_state(engine: Engine, directory: str | Path) -> None:
    """Write models, optimizers (sharded, one file per rank), schedulers and the engine's own
    state with `torch.distributed.checkpoint`; every rank must call it."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(engine), checkpoint_id=str(directory))


def load_state(engine: Engine, directory: str | Path) -> None:
    """Read what `save_state` wrote into the prepared models, optimizers and schedulers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = _state(engine)
    dcp.load(state, checkpoint_id=str(directory))
    for i, model in enumerate(engine._models):
        set_model_state_dict(model, state["models"][str(i)])
    for i, opt in enumerate(engine._optimizers):
        model = _owner(engine, opt)
        set_optimizer_state_dict(model, opt.optimizer, state["optimizers"][str(i)])
    for i, scheduler in enumerate(engine._schedulers):
        scheduler.load_state_dict(state["schedulers"][str(i)])
    engine.load_state_dict(state["engine"])


def trained_grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients to rescale in place: DTensor gradients by their local shards."""
    return [local(p.grad) for p in params if p.grad is not None]
