"""Small helpers shared by the check modules."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from guard import _report

_dtype_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def first_params(module: Any) -> list:
    """The module's first parameter, as a list for `tracker.owners` (one parameter is enough to
    find the optimizers of a model: all of its parameters belong to the same ones)."""
    first = next(module.parameters(), None)
    return [first] if first is not None else []


def report(
    code: str, message: str, level: _report.Level = "error", location: str | None = None
) -> None:
    """Report with a pointer to the shared catalogue text (at the user's current line, unless
    `location` names another)."""
    _report.report(code, f"{message} (accel-lint --explain {code})", level, location)


def trainable_dtypes(optimizer: Any) -> frozenset:
    """Dtypes of the optimizer's trainable parameters, computed once per optimizer."""
    cached = _dtype_cache.get(optimizer)
    if cached is None:
        cached = frozenset(
            p.dtype
            for group in optimizer.param_groups
            for p in group["params"]
            if getattr(p, "requires_grad", False)
        )
        _dtype_cache[optimizer] = cached
    return cached


def precision_of(accelerator: Any) -> Any:
    """The autocast dtype an Accelerator really applies (None = fp32)."""
    if accelerator is None or not getattr(accelerator, "native_amp", False):
        return None
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(
        str(getattr(accelerator, "mixed_precision", "no"))
    )


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def scale_of(scaler: Any) -> str:
    """The scaler's current scale as text (a host sync: call only on the reporting path)."""
    try:
        return f"{scaler.get_scale():g}"
    except Exception:  # a scaler that never scaled has no scale tensor yet
        return "S"


def output_tensors(output: Any) -> list:
    """The tensors a module returned: itself, or the items of a tuple, list or dict (one level)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if not isinstance(output, (list, tuple)):
        return []
    return [t for t in output if isinstance(t, torch.Tensor)]


def records_graph(output: Any) -> bool:
    """Whether a module output carries an autograd graph (a frozen module's does not)."""
    return any(t.grad_fn is not None for t in output_tensors(output))


def grad_norm(optimizer: Any) -> torch.Tensor | None:
    """The total 2-norm of the optimizer's gradients as a device tensor (no host read), None when
    there are none. Sparse gradients (`nn.Embedding(sparse=True)` with SparseAdam) count by
    their stored values: torch's norm kernels do not take sparse tensors."""
    groups = optimizer.param_groups if optimizer is not None else []
    grads = [p.grad for g in groups for p in g["params"] if p.grad is not None]
    if not grads:
        return None
    dense = [g.coalesce().values() if g.is_sparse else g for g in grads]
    total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if total_norm is not None:
        return total_norm(dense, error_if_nonfinite=False)
    device = dense[0].device
    norms = [torch.linalg.vector_norm(g).float().to(device) for g in dense]
    return torch.linalg.vector_norm(torch.stack(norms))
