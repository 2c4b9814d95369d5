"""The run's configuration as the guard saw it: who trains (guard.Engine, Accelerate or a plain
loop), the precision asked for and the one really applied, K, the world size, the optimizers and
the schedulers. Read at exit from what the tracker learned during the run (no host reads)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from guard import _report


def configuration(tracker: Any, rec: Any) -> dict:
    """A JSON-ready description of the run (see the README's "Run report" section)."""
    owner = _owner(tracker, rec)
    windows = [row.micro_batches for s in (rec.series if rec else []) for row in s.rows]
    return {
        "script": os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None,
        "argv": list(sys.argv[1:]),
        "pid": os.getpid(),
        "rank": rec.rank if rec else 0,
        "world_size": _world_size(rec),
        "mode": _report.mode(),
        "trainer": _trainer_name(owner),
        "precision_requested": _requested(owner),
        "precision_effective": _effective(rec),
        "grad_scaler": bool(rec and rec.scaled),
        "accumulation_steps": _accumulation(owner),
        "accumulation_observed": Counter(windows).most_common(1)[0][0] if windows else None,
        "optimizers": [_optimizer_row(s) for s in (rec.series if rec else [])],
        "schedulers": _schedulers(tracker, rec),
        "torch": _torch_version(),
        "settings": _settings(),
    }


def _settings() -> list[dict]:
    """The command line's settings (argparse, nanoGPT's configurator): value, default and
    whether this run changed it."""
    from guard import _run_settings

    return _run_settings.rows()


def _owner(tracker: Any, rec: Any) -> Any:
    """The guard.Engine or Accelerator that prepared this run's optimizers, or None (a plain
    loop). Without any optimizer step, the latest Accelerator, if one was built."""
    series = rec.series if rec else []
    for s in series:
        owner = s.owner()
        if owner is not None:
            return owner
    return None if series else tracker.accelerator()


def _trainer_name(owner: Any) -> str:
    if owner is None:
        return "plain PyTorch"
    module = type(owner).__module__
    if module.startswith("guard"):
        return "guard.Engine"
    if module.startswith("accelerate"):
        return "accelerate.Accelerator"
    return type(owner).__name__


def _requested(owner: Any) -> str | None:
    value = getattr(owner, "mixed_precision", None) if owner is not None else None
    return None if value is None else str(getattr(value, "value", value))


_SHORT = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def _effective(rec: Any) -> str:
    """What really ran: the dtypes of the enabled autocast regions entered (fp32 when none) and
    whether a GradScaler scaled the loss. Accelerate on a CPU reports fp16 and trains fp32:
    this shows it."""
    if rec is None:
        return "unknown"
    dtypes = ", ".join(_SHORT.get(d, d.replace("torch.", "")) for d in rec.autocast) or "fp32"
    return dtypes + (" + GradScaler" if rec.scaled else "")


def _accumulation(owner: Any) -> int | None:
    value = getattr(owner, "gradient_accumulation_steps", None) if owner is not None else None
    return int(value) if isinstance(value, int) else None


def _world_size(rec: Any) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return rec.world_size if rec else 1


def _optimizer_row(series: Any) -> dict:
    first_lr = next((row.lr for row in series.rows if row.lr is not None), None)
    return {
        "index": series.index,
        "type": series.name,
        "parameters": series.parameters,
        "param_groups": series.param_groups,
        "first_lr": first_lr,
    }


def _schedulers(tracker: Any, rec: Any) -> list[str]:
    names = list(rec.schedulers.values()) if rec else []
    for scheduler in list(tracker.prepared_schedulers.keys()):
        if id(scheduler) not in (rec.schedulers if rec else {}):
            names.append(type(scheduler).__name__)
    return names


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", None)
