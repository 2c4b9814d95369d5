"""The only place the guard reads private torch state, each behind a feature test.

GradScaler's per-optimizer stage and `_scale` are not public API. When a
torch build lacks one, the check that needs it is skipped with a one-time warning naming the check,
and everything else keeps working.
"""

from __future__ import annotations

import warnings
from typing import Any

from guard._report import GuardWarning

_MISSING = object()
# Feature name -> available? Filled by `probe()`; tests set entries to False to simulate absence.
FEATURES: dict[str, bool] = {}
_warned: set[str] = set()


def probe() -> dict[str, bool]:
    """Detect the private attributes on a throwaway scaler."""
    import torch

    scaler = torch.amp.GradScaler("cpu", enabled=True)
    FEATURES["scaler_stage"] = isinstance(getattr(scaler, "_per_optimizer_states", None), dict)
    FEATURES["scaler_scale"] = hasattr(scaler, "_scale")
    try:
        from torch.amp.grad_scaler import OptState

        FEATURES["scaler_stage"] &= hasattr(OptState, "STEPPED")
    except ImportError:
        FEATURES["scaler_stage"] = False
    return dict(FEATURES)


def available(feature: str, needed_by: str) -> bool:
    """Whether `feature` can be used; warns once per feature when it cannot."""
    if not FEATURES:
        probe()
    if FEATURES.get(feature, False):
        return True
    if feature not in _warned:
        _warned.add(feature)
        warnings.warn(
            f"accel-guard: this torch has no {feature.replace('_', ' ')} API; "
            f"{needed_by} is skipped, the other checks keep running",
            GuardWarning,
            stacklevel=3,
        )
    return False


def scaler_stage(scaler: Any, optimizer: Any, needed_by: str) -> str | None:
    """'READY' | 'UNSCALED' | 'STEPPED' for `optimizer` under `scaler`, or None if unknown."""
    if not available("scaler_stage", needed_by):
        return None
    state = scaler._per_optimizer_states.get(id(optimizer))
    stage = state.get("stage") if isinstance(state, dict) else None
    return getattr(stage, "name", None)


def scaler_found_inf(scaler: Any, optimizers: list, needed_by: str) -> Any:
    """A device tensor, > 0 when `scaler.step` found inf/NaN for any of `optimizers` (take it
    before `update()` clears the record; no host read); None if unknown or nothing recorded."""
    if not available("scaler_stage", needed_by):
        return None
    values = []
    for optimizer in optimizers:
        state = scaler._per_optimizer_states.get(id(optimizer))
        found = state.get("found_inf_per_device") if isinstance(state, dict) else None
        if isinstance(found, dict):
            values.extend(v.reshape(-1).float() for v in found.values())
    if not values:
        return None
    import torch

    return torch.cat([v.to(values[0].device) for v in values]).sum()


def scaler_scale(scaler: Any) -> Any:
    """The scaler's scale as its device tensor (no host read), None when it has none yet or this
    torch has no `_scale` (callers then read `get_scale()`)."""
    if not FEATURES:
        probe()
    if not FEATURES.get("scaler_scale", False):
        return None
    return getattr(scaler, "_scale", None)


def scaler_scale_missing(scaler: Any, needed_by: str) -> bool | None:
    """True when `scale()` was never called on `scaler` (torch asserts later); None if unknown."""
    if not available("scaler_scale", needed_by):
        return None
    return getattr(scaler, "_scale", _MISSING) is None


def reset_warnings() -> None:
    _warned.clear()
