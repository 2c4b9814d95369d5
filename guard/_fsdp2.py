"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for `guard.Engine`.

The engine keeps its DDP semantics (loss / K, the tail window, `num_items`) and only swaps the
mechanics, which live here so that `engine.py` stays one branch per concern:

- sharding: `fully_shard` on each block chosen by the plugin's policy, then on the root, with a
  `MixedPrecisionPolicy(param_dtype=bf16|fp16, reduce_dtype=fp32)` for the engine's precision;
- accumulation: `set_requires_gradient_sync(False)` on non-sync micro-steps (FSDP2's `no_sync`),
  so gradients are reduce-scattered once per optimizer step;
- gradients are DTensors: the engine rescales their local shards in place, and reports the
  clipped norm as a plain tensor (torch's `clip_grad_norm_` over DTensors already all-reduces it);
- checkpoints: see guard/_engine_sharded.py (`torch.distributed.checkpoint`, resharded on load).

A GradScaler needs nothing extra: torch's found-inf check over DTensor gradients reduces the
flag across the shards' ranks, so every rank skips the same steps (the guard checks that).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

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
        mixed_precision_policy: a `torch.distributed.fsdp.MixedPrecisionPolicy` used instead of
            the engine's; its `param_dtype` must be the engine's precision (or None).
    """

    auto_wrap_policy: WrapPolicy = None
    reshard_after_forward: bool | None = None
    mixed_precision_policy: Any = None


def resolve(plugin: Any) -> FSDP2Plugin | None:
    """The engine's `fsdp_plugin` argument: None, True / "fsdp2" (defaults), a plugin, or
    Accelerate's `FullyShardedDataParallelPlugin(fsdp_version=2, ...)`."""
    if plugin is None or plugin is False:
        return None
    if plugin is True or plugin == "fsdp2":
        return FSDP2Plugin()
    if isinstance(plugin, FSDP2Plugin):
        return plugin
    accelerate_plugin = _accelerate_plugin_class()
    if accelerate_plugin is not None and isinstance(plugin, accelerate_plugin):
        return from_accelerate(plugin)
    raise TypeError(
        "fsdp_plugin must be a guard.FSDP2Plugin, Accelerate's FullyShardedDataParallelPlugin, "
        f"True or None, not {plugin!r}"
    )


# ------------------------------------------------------------------- Accelerate's FSDP plugin
@dataclass(frozen=True)
class LayerClassNames:
    """Accelerate's `transformer_based_wrap`: shard every module whose class has one of these
    names; None: the model's `_no_split_modules` (as Accelerate does). Resolved on the model."""

    names: tuple[str, ...] | None


@dataclass(frozen=True)
class MinParams:
    """Accelerate's `size_based_wrap`: shard every module holding more than `count` parameters,
    except containers without a forward (`fully_shard` refuses a ModuleList or ModuleDict)."""

    count: int

    def __call__(self, module: torch.nn.Module) -> bool:
        if isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict):
            return False
        return sum(p.numel() for p in module.parameters()) > self.count


def root_only(module: torch.nn.Module) -> bool:
    """Accelerate's `no_wrap`: no block gets its own unit, only the root is sharded."""
    return False


def _accelerate_plugin_class() -> type | None:
    """Accelerate's plugin class, only if the user imported it (never imports accelerate)."""
    module = sys.modules.get("accelerate.utils.dataclasses")
    return getattr(module, "FullyShardedDataParallelPlugin", None)


def _offloads(value: Any) -> bool:
    from torch.distributed.fsdp import CPUOffloadPolicy

    return value is True or isinstance(value, CPUOffloadPolicy)


def _full_state_dict(value: Any) -> bool:
    return value is not None and getattr(value, "name", str(value)).upper() != "SHARDED_STATE_DICT"


# Accelerate's fields the engine cannot honour: (field, whether the plugin asks for it, why).
_REFUSED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("sharding_strategy", lambda v: v is not None, "FSDP2 has none; use reshard_after_forward"),
    ("cpu_offload", _offloads, "the engine does not offload parameters"),
    ("ignored_modules", lambda v: v is not None, "the engine shards every parameter"),
    ("activation_checkpointing", bool, "the engine does not checkpoint activations"),
    ("activation_checkpointing_offload", bool, "the engine does not checkpoint activations"),
    ("cpu_ram_efficient_loading", bool, "the engine does not load models on the meta device"),
    ("param_init_fn", lambda v: v is not None, "the engine does not initialise meta modules"),
    ("forward_prefetch", bool, "FSDP2 has no forward prefetch"),
    ("backward_prefetch", lambda v: v is not None, "FSDP2 has no backward prefetch"),
    (
        "state_dict_type",
        _full_state_dict,
        "engine.save_sharded_state writes sharded torch.distributed.checkpoint state only",
    ),
)


def from_accelerate(plugin: Any) -> FSDP2Plugin:
    """Map Accelerate's `FullyShardedDataParallelPlugin` (after its own `__post_init__`) onto
    FSDP2Plugin; a field the engine cannot honour raises instead of being dropped silently."""
    if plugin.fsdp_version != 2:
        raise NotImplementedError(
            f"guard.Engine shards with FSDP2 only, not FSDP1 (fsdp_version={plugin.fsdp_version}):"
            " pass FullyShardedDataParallelPlugin(fsdp_version=2, ...) or a guard.FSDP2Plugin"
        )
    for name, asks, why in _REFUSED:
        value = getattr(plugin, name, None)
        if asks(value):
            raise NotImplementedError(
                f"guard.Engine does not support FullyShardedDataParallelPlugin({name}={value!r}):"
                f" {why}"
            )
    return FSDP2Plugin(
        auto_wrap_policy=_wrap_policy(plugin),
        reshard_after_forward=plugin.reshard_after_forward,
        mixed_precision_policy=plugin.mixed_precision_policy,
    )


def _wrap_policy(plugin: Any) -> WrapPolicy:
    """Accelerate's auto_wrap_policy (None, torch's transformer/size policies, or a partial of
    them) as an FSDP2Plugin policy."""
    from torch.distributed.fsdp.wrap import (
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    policy = plugin.auto_wrap_policy
    partial = isinstance(policy, functools.partial)
    base, keywords = (policy.func, policy.keywords) if partial else (policy, {})
    if policy is None:
        return root_only
    if base is transformer_auto_wrap_policy:
        names = plugin.transformer_cls_names_to_wrap
        if names is None and keywords.get("transformer_layer_cls"):
            return tuple(keywords["transformer_layer_cls"])
        return LayerClassNames(None if names is None else tuple(names))
    if base is size_based_auto_wrap_policy:
        count = plugin.min_num_params or keywords.get("min_num_params", 0)
        return MinParams(count) if count > 0 else root_only
    raise NotImplementedError(
        f"guard.Engine does not support FullyShardedDataParallelPlugin(auto_wrap_policy={policy!r})"
        ": pass 'transformer_based_wrap' (with transformer_cls_names_to_wrap), 'size_based_wrap'"
        " (with min_num_params), 'no_wrap', or guard.FSDP2Plugin(auto_wrap_policy=predicate)"
    )


def _layer_classes(model: torch.nn.Module, policy: LayerClassNames) -> tuple[type, ...]:
    names = policy.names
    if names is None:
        names = tuple(getattr(model, "_no_split_modules", None) or ())
    found = {type(m).__name__: type(m) for m in model.modules()}
    missing = [name for name in names if name not in found]
    if missing:
        raise ValueError(f"transformer_cls_names_to_wrap: no {missing[0]} module in the model")
    return tuple(found[name] for name in names)


def mixed_precision_policy(plugin: FSDP2Plugin, precision: str) -> Any:
    """The plugin's MixedPrecisionPolicy when it agrees with the engine's precision, else the
    engine's own: param_dtype bf16|fp16 (fp32 for "no"), reduce_dtype fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    engine_dtype = _DTYPES.get(precision, torch.float32)
    given = plugin.mixed_precision_policy
    if given is None:
        if precision in _DTYPES:
            return MixedPrecisionPolicy(param_dtype=engine_dtype, reduce_dtype=torch.float32)
        return MixedPrecisionPolicy()
    if given.param_dtype not in (None, engine_dtype):
        raise ValueError(
            f"mixed_precision_policy.param_dtype={given.param_dtype} disagrees with the engine's "
            f"mixed_precision={precision!r}: pass the matching guard.Engine(mixed_precision=...)"
        )
    return given


def is_sharded(model: Any) -> bool:
    """Whether `model` is an FSDP2 module (cheap when FSDP was never imported)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def shard(model: torch.nn.Module, plugin: FSDP2Plugin, precision: str) -> torch.nn.Module:
    """`fully_shard` the policy's blocks (innermost first), then the root; returns the root."""
    from torch.distributed.fsdp import fully_shard

    options: dict[str, Any] = {"mp_policy": mixed_precision_policy(plugin, precision)}
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
    if isinstance(policy, LayerClassNames):
        policy = _layer_classes(model, policy)
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


def trained_grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients to rescale in place: DTensor gradients by their local shards."""
    return [local(p.grad) for p in params if p.grad is not None]
