"""The guard's host reads, batched: at most one per optimizer step.

On a GPU every read of a device value (`.item()`, `bool(t)`, `.tolist()`, ...) waits for the
device queue to drain. So the checks keep their flags and counts on the device and hand them to
`StepReads.defer(tensors, callback)`; they are read together, in one `.tolist()`, by the first
of these that comes:

- ACL601's check before an optimizer step without a GradScaler (fp32, bf16), which must know
  before the step whether the gradients are finite, since its `raise` and `skip` policies act
  before any weight changes: its norm and losses join the same read (`read(tensors)`);
- the tracker's wrapper around `GradScaler.update` (fp16), which reads the scaler's found-inf
  record and the scale before and after in that same read;
- otherwise, the next optimizer step's pre-hook or the end of the run (`flush_stale`), for
  values deferred at an earlier step.

A callback runs with the report's step and location set to the optimizer step and the user's line
at which its values were deferred, so a finding read one step late still names the step (and the
line) it happened at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from guard import _report


@dataclass
class _Deferred:
    tensors: list
    callback: Callable[[list[list[float]]], None]
    step: int
    location: str | None


class StepReads:
    """Device values waiting for the step's one host read."""

    def __init__(self) -> None:
        self._pending: list[_Deferred] = []

    def defer(self, tensors: Sequence, callback: Callable[[list[list[float]]], None]) -> None:
        """Call `callback(values)` at the next read, `values[i]` the elements of `tensors[i]`."""
        step, where = _report.current_step(), _report.user_location()
        self._pending.append(_Deferred(list(tensors), callback, step, where))

    def read(self, tensors: Sequence = ()) -> list[list[float]]:
        """One host read of `tensors` and of everything deferred; runs the deferred callbacks
        and returns the elements of each of `tensors`. A GuardError from a callback is raised
        after all of them ran."""
        batch = self._pending
        parts = list(tensors) + [t for d in batch for t in d.tensors]
        if not parts:
            return []
        values = _read_together(parts)
        self._pending = []
        own, rest = values[: len(tensors)], values[len(tensors) :]
        error = None
        for deferred in batch:
            mine, rest = rest[: len(deferred.tensors)], rest[len(deferred.tensors) :]
            try:
                with _report.at_step(deferred.step, deferred.location):
                    deferred.callback(mine)
            except _report.GuardError as exc:
                error = error or exc
        if error is not None:
            raise error
        return own

    def flush_stale(self) -> None:
        """Read what was deferred at an earlier step (nothing happens when nothing was)."""
        if self._pending and self._pending[0].step < _report.current_step():
            self.read()

    def flush(self) -> None:
        if self._pending:
            self.read()


def _read_together(parts: list) -> list[list[float]]:
    """The elements of each tensor, from one `.tolist()` of their concatenation (float64 keeps
    token counts and inf/NaN exact). The usual step (a norm and 0-dim losses of one dtype and
    device) takes one `stack` instead, a lone scalar one `.item()`. DTensors (FSDP2's clip norm)
    are read whole."""
    parts = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in parts]
    if len(parts) == 1 and parts[0].dim() == 0:  # the usual unsampled step: the clip norm
        return [[parts[0].item()]]
    if all(p.dim() == 0 and p.dtype == parts[0].dtype for p in parts):
        try:
            return [[v] for v in torch.stack(parts).tolist()]
        except RuntimeError:  # on different devices: the general path moves them
            pass
    device = parts[0].device
    flat = [torch.as_tensor(p).detach().reshape(-1).to(device, torch.float64) for p in parts]
    values = torch.cat(flat).tolist()
    out, start = [], 0
    for piece in flat:
        out.append(values[start : start + piece.numel()])
        start += piece.numel()
    return out
