"""ACL104: torch's clip functions on gradients they cannot measure correctly.

- Gradients that still carry the loss scale S (no `unscale_` first): an error, before clipping.
- The parameters of an FSDP1 (`FullyShardedDataParallel`) model with sharded gradients: torch's
  `clip_grad_norm_` measures each rank's shard only, so ranks clip by different factors. The
  call is reported (a warning) and redirected to the model's own `clip_grad_norm_`, which
  all-reduces the norm, so the step is the one the user meant. A subset of an FSDP model's
  parameters cannot be redirected (FSDP clips the whole model): that is an error.

FSDP1 models are noticed when they are built, through torch's public module-registration hook
(an FSDP1 wrapper registers the module it wraps as its child). FSDP2's DTensor parameters need
nothing here (torch's clip all-reduces their norm); a clip over their local shards is reported
by `acl104_clip_scaled_grads_fsdp2`.
"""

from __future__ import annotations

import sys
import weakref

import torch

from guard import _patch, _report
from guard.checks._common import report, scale_of

CODES = ("ACL104",)
_fsdp_models: weakref.WeakSet = weakref.WeakSet()


def install(tracker) -> None:
    def before_clip(kind, parameters, states, via, redirect=None, **_) -> None:
        if via != "accelerate":  # Accelerate's clip unscales first, inside the call
            _refuse_scaled(kind, states)
        if kind == "norm" and via == "torch" and _fsdp_models and redirect is not None:
            _redirect_fsdp(tracker, parameters, redirect)

    tracker.subscribe("clip", before_clip)
    register = torch.nn.modules.module.register_module_module_registration_hook
    _patch.track(register(_note_fsdp))


def _note_fsdp(module, _name, _submodule):
    fsdp = sys.modules.get("torch.distributed.fsdp")  # none can exist before it is imported
    if fsdp is not None and isinstance(module, fsdp.FullyShardedDataParallel):
        _fsdp_models.add(module)
    return None


def _refuse_scaled(kind: str, states) -> None:
    for st in states:
        if not st.scaled_pending or st.unscaled or st.scaler is None:
            continue
        scale = scale_of(st.scaler)
        effect = (
            f"the norm it compares with max_norm (and returns) is {scale}x too large, so the step "
            f"is clipped to about max_norm/{scale}"
            if kind == "norm"
            else f"clip_value is applied to gradients {scale}x too large"
        )
        report(
            "ACL104",
            f"clip_grad_{kind}_ on scaled gradients: {effect}; call scaler.unscale_(opt) before "
            "clipping (or accelerator.clip_grad_norm_ under Accelerate)",
        )
        return


def _redirect_fsdp(tracker, parameters: list, redirect: list) -> None:
    if not _report.enabled("ACL104"):
        return
    passed = {id(p) for p in parameters}
    root, managed = _outermost_fsdp(passed)
    if root is None or not _shards_gradients(root):
        return
    if passed != managed:
        report(
            "ACL104",
            "torch.nn.utils.clip_grad_norm_ on part of an FSDP model's parameters measures only "
            "this rank's shard of them, so ranks clip by different factors; clip the whole "
            "model with model.clip_grad_norm_(max_norm) (accelerator.clip_grad_norm_)",
        )
        return

    def fsdp_clip(max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        with tracker.flag("clip_via", "fsdp"):  # FSDP may call torch's clip itself
            return root.clip_grad_norm_(max_norm, norm_type)

    report(
        "ACL104",
        "torch.nn.utils.clip_grad_norm_ on an FSDP model's parameters measures only this rank's "
        "shard, so ranks clip by different factors; the guard called model.clip_grad_norm_"
        "(max_norm) instead: call that (or accelerator.clip_grad_norm_) in your code",
        "warning",
    )
    redirect.append(fsdp_clip)


def _outermost_fsdp(passed: set) -> tuple:
    """The FSDP model sharing parameters with `passed` that manages the most of them."""
    best, best_ids = None, set()
    for model in list(_fsdp_models):
        ids = {id(p) for p in model.parameters()}
        if ids & passed and len(ids) > len(best_ids):
            best, best_ids = model, ids
    return best, best_ids


def _shards_gradients(root) -> bool:
    """False when every FSDP unit uses NO_SHARD (each rank holds the full, all-reduced grads)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    units = FullyShardedDataParallel.fsdp_modules(root)
    return any(unit.sharding_strategy != ShardingStrategy.NO_SHARD for unit in units)
