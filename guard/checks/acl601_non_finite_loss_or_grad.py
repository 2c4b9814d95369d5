"""ACL601: a non-finite loss or gradient about to reach the optimizer.

At each real step, before any parameter changes, the total gradient norm is checked once (nothing
per micro-step); when the window was clipped, the norm the clip computed is reused. Without a
scaler, each backward also keeps a detached reference to its loss (no kernel per micro-step); at
the step the norm and the losses are read in the step's one host read (`guard._step_reads`,
which carries what the other checks deferred too): a NaN loss can leave finite gradients (a
detached NaN term), which the norm alone misses. This read must come before the step, since the
`raise` and `skip` policies act before any weight changes: it is the guard's one host sync per
step in fp32 and bf16.
Under a GradScaler, inf gradients are the scaler's business (an overflow: the PyTorch
gradient-penalty recipe produces them on purpose, and ACL603 reports a persistent streak), so
there only a NaN loss before scaling is reported, as a warning, since the scaler will skip the
step. That flag is recorded on the device at `scale()` and deferred at the step to the read the
tracker makes at `GradScaler.update` (the same step, no read of its own). A loss scaled while
an earlier scaled loss of the same scaler went to `torch.autograd.grad` instead of backward, and
that contains the earlier loss (the gradient-penalty recipe: loss + a penalty built from scaled
gradients), is judged by the earlier loss: a NaN that enters only through the scaled gradients
is an overflow, which the scaler skips.

Options: `guard.configure(nonfinite_policy="skip")` (default "raise"): instead of an error, warn,
clear the optimizer's gradients and let the step run without them, so no parameter changes.
`guard.configure(anomaly=1)` or ACCEL_GUARD_ANOMALY=1: from the first ACL601 finding on, autograd's
anomaly mode is on (`torch.autograd.set_detect_anomaly(True)`), so the next backward that produces
a NaN fails naming its backward function and printing the forward line that created it. The guard
does not own the batch, so it cannot re-run the offending one; it needs a later occurrence (warn
mode, the skip policy, or a caught GuardError). Anomaly mode is slow, and under a GradScaler an
ordinary overflow that turns into NaN inside the backward then fails too; `guard.uninstall()`
turns it off again.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from guard import _patch, _report
from guard.checks._common import grad_norm, report

CODES = ("ACL601",)
OPTIONS = {"nonfinite_policy": "raise", "anomaly": 0}


@dataclass
class StepInputs:
    """What ACL601 keeps of an optimizer's window until its step (`OptState.of`)."""

    not_nan: list = field(default_factory=list)  # scaled losses' not-NaN flags (device tensors)
    raw_losses: list | None = None  # detached unscaled losses since the last step
    norm: tuple[Any, int] | None = None  # (a clip's total norm, the backward pass it saw)

    def clear(self) -> None:
        self.not_nan, self.raw_losses, self.norm = [], None, None


# scaler -> (loss node, not-NaN flag) of a scaled loss that no backward, zero_grad or update
# followed yet
_UNCONSUMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def install(tracker) -> None:
    tracker.subscribe("scale", _after_scale)
    tracker.subscribe("backward", _after_scaled_backward, when="scaled")
    # the losses only word the finding (the gradient norm read at every step catches the
    # damage): kept in sampled windows, where the graph of the loop is measured anyway
    tracker.subscribe("backward", _after_raw_backward, sampled=True)
    tracker.subscribe("clip_done", lambda **kw: _after_clip(tracker.backward_id, **kw))
    tracker.subscribe("scaler_step_pre", lambda **kw: _before_scaler_step(tracker.reads, **kw))
    tracker.subscribe(
        "optimizer_step_pre", lambda **kw: _before_step(tracker.reads, tracker.backward_id, **kw)
    )
    tracker.subscribe("zero_grad", _after_zero_grad)
    tracker.subscribe("update", lambda scaler, **_: _UNCONSUMED.pop(scaler, None))


def _after_scale(scaler, outputs, scaled, **_) -> None:
    if not (isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor)):
        return
    earlier = _UNCONSUMED.pop(scaler, None)
    if earlier is not None and _contains(outputs, earlier[0]):
        scaled._guard_loss_not_nan = earlier[1]  # NaN from the scaled gradients: an overflow
        return
    flag = ~torch.isnan(outputs.detach()).any()
    scaled._guard_loss_not_nan = flag
    _UNCONSUMED[scaler] = (outputs.grad_fn, flag)


def _contains(loss: torch.Tensor, node) -> bool:
    """Whether `node` is in the graph of `loss` (breadth-first: a penalty's loss sits near the
    root, its gradient graph lies deeper)."""
    if node is None or loss.grad_fn is None:
        return False
    seen, queue = set(), deque([loss.grad_fn])
    while queue:
        current = queue.popleft()
        if current is node:
            return True
        if current in seen:
            continue
        seen.add(current)
        queue.extend(child for child, _ in current.next_functions if child is not None)
    return False


def _after_scaled_backward(tensors, scaled_by, states, **_) -> None:
    """A scaled loss's not-NaN flag joins the step's read (fp16: the scaler's step)."""
    if scaled_by is None:
        return
    _UNCONSUMED.pop(scaled_by, None)
    flag = getattr(tensors[0], "_guard_loss_not_nan", None)
    if flag is not None:
        for st in states:
            st.of(StepInputs).not_nan.append(flag)


def _after_raw_backward(tensors, scaled_by, states, **_) -> None:
    """An unscaled loss is kept (detached) to tell a non-finite loss from non-finite gradients."""
    if scaled_by is not None:
        return
    raw = [t.detach() for t in tensors if t.is_floating_point()]
    if raw:
        for st in states:
            window = st.of(StepInputs)
            if window.raw_losses is None:
                window.raw_losses = []
            window.raw_losses.extend(raw)


def _all_finite(values: list[list[float]]) -> bool:
    return all(math.isfinite(v) for row in values for v in row)


def _after_clip(backward_id: int, kind, states, result, **_) -> None:
    """A clip's norm, with the backward pass it saw: a norm is stale once more gradient
    arrives (a backward after the clip), and then the step computes its own."""
    if kind == "norm" and isinstance(result, torch.Tensor):
        for st in states:
            st.of(StepInputs).norm = (result, backward_id)


def _after_zero_grad(states, **_) -> None:
    _UNCONSUMED.clear()  # a new iteration: an earlier scaled loss cannot be part of the next one
    for st in states:
        st.of(StepInputs).clear()


def _before_scaler_step(reads, state, **_) -> None:
    """The NaN-loss flags join the step's one host read (the tracker's at `update()`): the
    scaler skips such a step anyway, so the warning may wait until then."""
    window = state.of(StepInputs)
    flags = window.not_nan
    window.clear()
    if flags:
        reads.defer(flags, _report_nan_losses)


def _report_nan_losses(values: list[list[float]]) -> None:
    bad = sum(1 for (flag,) in values if not flag)
    if bad:
        report(
            "ACL601",
            f"{bad} of {len(values)} loss(es) since the last step were NaN before loss scaling: "
            "that is a bug in the loss, not an fp16 overflow (the scaler will skip the step); "
            + _find_the_source(),
            "warning",
        )


def _before_step(reads, backward_id, optimizer, state, in_scaler_step, **_) -> None:
    """The one host read that must come before the step (its policies act before any weight
    changes): the gradient norm and the window's losses, with whatever the checks deferred."""
    window = state.of(StepInputs)
    losses, window.raw_losses = window.raw_losses, None
    if in_scaler_step or state.scaled_pending:
        return  # the scaler's inf check runs (or ACL102 reports the bypass)
    clipped, window.norm = window.norm, None
    norm = clipped[0] if clipped is not None and clipped[1] == backward_id else None
    if norm is None:
        norm = grad_norm(optimizer)
    values = reads.read(([] if norm is None else [norm]) + (losses or []))
    if _all_finite(values):
        return
    what = _problem(values[0][0] if norm is not None else None, values[norm is not None :])
    what = f"optimizer step {state.steps + 1}: {what}{_first_offender(optimizer)}"
    if _report.option("nonfinite_policy", OPTIONS["nonfinite_policy"]) == "skip":
        _clear_gradients(optimizer)
        report(
            "ACL601",
            f"{what}: gradients cleared, this step changes nothing; {_find_the_source()}",
            "warning",
        )
        return
    report(
        "ACL601",
        f"{what}: this step would write inf/NaN into every weight it updates; skip such batches "
        f"or clip with error_if_nonfinite=True; {_find_the_source()}",
    )


def _first_offender(optimizer) -> str:
    """The first parameter (in the optimizer's order) whose gradient is not finite, by its name
    in the model. Only on the failure path: one host read per parameter until it is found."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            values = grad.coalesce().values() if grad.is_sparse else grad
            if not bool(torch.isfinite(values).all()):
                name = _parameter_name(p)
                return f"; the first parameter with a non-finite gradient is {name}"
    return ""


def _parameter_name(param) -> str:
    """`param`'s qualified name in its model (the outermost module holding it, a DDP or
    compiled wrapper looked through), found among the live modules; its shape if none has it."""
    modules = [obj for obj in gc.get_objects() if _is_module(obj)]
    children = {id(child) for module in modules for child in module.children()}
    for root in modules:
        if id(root) in children:
            continue
        root = getattr(root, "_orig_mod", root)
        inner = getattr(root, "module", None)
        root = inner if isinstance(inner, torch.nn.Module) else root
        for name, candidate in root.named_parameters():
            if candidate is param:
                return f"`{name}`"
    return f"a parameter of shape {tuple(param.shape)}"


def _is_module(obj) -> bool:
    """A module among the collector's objects, judged by its real type: `isinstance` reads
    `obj.__class__`, which some objects answer with a warning of their own (torch.distributed's
    deprecated `reduce_op`), and a weak proxy forwards (a dead one raises ReferenceError). A
    live proxy's module is in the list itself."""
    return issubclass(type(obj), torch.nn.Module)


def _find_the_source() -> str:
    """Advice on finding where the NaN comes from (arming anomaly mode when the option asks)."""
    if _arm_anomaly_mode():
        return (
            "autograd's anomaly mode is on from now: the next backward that produces NaN fails "
            "naming the operation"
        )
    return (
        "to name the operation, run with ACCEL_GUARD_ANOMALY=1 (autograd's anomaly mode from "
        "the first finding on)"
    )


def _arm_anomaly_mode() -> bool:
    """With option anomaly=1, turn autograd's anomaly mode on; whether the option is on."""
    if not _report.option("anomaly", OPTIONS["anomaly"]) or not _report.enabled("ACL601"):
        return False
    if not torch.is_anomaly_enabled():
        torch.autograd.set_detect_anomaly(True)
        _patch.track(_AnomalyModeOff())
    return True


class _AnomalyModeOff:
    """Turns autograd's anomaly mode off again at `guard.uninstall()` (a tracked 'handle')."""

    def remove(self) -> None:
        torch.autograd.set_detect_anomaly(False)


def _problem(norm: float | None, losses: list[list[float]]) -> str:
    """What is non-finite, worded from the values already read."""
    grads = "" if norm is None else f"the total gradient norm is {norm}"
    if _all_finite(losses):
        return f"{grads} (a non-finite loss or gradient)"
    loss = "a loss passed to backward since the last step was inf/NaN"
    return f"{loss} and {grads}" if grads and not math.isfinite(norm) else loss


def _clear_gradients(optimizer) -> None:
    """Optimizers skip parameters whose grad is None, so the step that follows is a no-op."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


class EngineLosses:
    """The engine's case, while the guard is not installed (installed, the checks above see
    every backward): a non-finite loss in the window, read once at the update step (one host
    read)."""

    def __init__(self) -> None:
        self._losses: list[torch.Tensor] = []

    def record(self, loss: torch.Tensor) -> None:
        """Keep a detached reference: no kernel and no host read on the micro-step path."""
        self._losses.append(loss.detach())

    def check(self, scaled: bool) -> None:
        """Report before the optimizer runs; under a scaler only as a warning (it skips)."""
        losses, self._losses = self._losses, []
        if not losses:
            return
        # a non-scalar loss is summed in fp32 (a fp16 sum could overflow); stack promotes dtypes,
        # and one .tolist() is the single host read (cheaper than isfinite + all + bool kernels)
        losses = [loss.float().sum() if loss.dim() else loss for loss in losses]
        if all(math.isfinite(value) for value in torch.stack(losses).tolist()):
            return
        if scaled:
            report(
                "ACL601",
                "a loss in this window was inf/NaN before loss scaling: the scaler will skip the "
                "step, but an unscaled non-finite loss is a bug in the model or data, not an "
                "overflow",
                "warning",
            )
            return
        report(
            "ACL601",
            "a loss in this window was inf/NaN: stepping would write it into every weight (and "
            "Adam's moments); the step was refused before any parameter changed",
        )

    @staticmethod
    def check_norm(norm: torch.Tensor) -> None:
        """ACL601 for the gradient norm that clipping computed anyway (no scaler active)."""
        if not bool(torch.isfinite(norm)):
            report(
                "ACL601",
                f"the total gradient norm is {float(norm)}: stepping would write it into every "
                "weight; the step was refused before any parameter changed",
            )
