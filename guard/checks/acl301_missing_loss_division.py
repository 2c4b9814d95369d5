"""ACL301 (heuristic warning): an accumulation window of k micro-batches summed, none divided.

Only raw loops: the engine and Accelerate divide by K themselves (a raw backward on their
objects is ACL101). At each backward the root of the loss graph is read for a constant factor
(`loss / k`, `loss * (1 / k)`) and the user's line that called backward is noted. At the step:

- k is the largest number of passes one backward line contributed. Accumulation runs the same
  line once per micro-batch; separate losses of one batch (a DCGAN's real and fake terms, a
  multi-task loss with `retain_graph`, SAM's two passes) come from different lines, so they give
  k = 1 and are not accumulation.
- the window is undivided when no pass was scaled down to about 1/k (a constant weight such as
  `0.5 * loss` with k = 4 is not a division by 4);
- the loss was not deliberately scaled up (a factor above 1, as YOLOv5's `loss * batch_size`,
  means the user manages the sum on purpose);
- and the gradients were not rescaled after the last backward: the norm of one probe gradient is
  kept on the device after each backward and compared at the step (one host read, only in a window
  that can still be reported), so `p.grad /= k` and fairseq's `p.grad.data.mul_(1 / n)` both count,
  as do `p.grad.div_(k)` and `torch._foreach_div_` / `_foreach_mul_`; in fp16 a rescaling before
  `scaler.unscale_` is noted when the unscale starts (the unscale itself then changes the norm again
  and is not the user's division). A norm clip rescales too, but it only hides the bug when the
  divided gradients would have been clipped to the same norm (total norm / k at or above max_norm).

Once a window had a divided pass (judged with the previous window's k), the rest of it costs
nothing, and only the tracker's sampled windows are read at all (the first 8 steps of an
optimizer and every 16th after): a loop that sums its window sums it in those too.
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from guard import _report
from guard.checks import _graph
from guard.checks._common import report

CODES = ("ACL301",)
_DIVIDED = 1.5  # a pass with factor * k at most this is "divided by k" (0.5 / k included)


@dataclass
class _Window:
    """One window's passes, from its first backward to its step (or zero_grad)."""

    divided: bool = False  # a pass was divided by about k: nothing more to watch
    factors: list = field(default_factory=list)  # the undivided passes' root factors
    sites: Counter = field(default_factory=Counter)  # backward line -> its passes
    watching: bool = False  # the probe gradient's norm is watched (from the second pass on)
    grads: Any = None  # that norm when last remembered (a device tensor, or None: unreadable)
    rescaled: bool = False  # the user rescaled the gradients since the last backward
    clean_before_clip: bool = False  # a norm clip starts on gradients the user did not rescale


@dataclass
class LossDivision:
    """ACL301's state of one optimizer (`OptState.of`)."""

    window: _Window | None = None  # None: no raw pass in this window yet
    previous_k: int = 0  # k of the optimizer's previous window
    probe: weakref.ref | None = None  # the parameter whose gradient norm is watched


def install(tracker) -> None:
    pending: dict = {}

    def before_backward(tensors, scaled_by, via, **_) -> None:
        if not tensors or via != "raw" or _all_divided(tracker.states):
            pending.clear()
            return
        factor = _graph.root_factor(tensors[0], scaled=scaled_by is not None)
        pending["factor"], pending["site"] = factor, None
        if not _divides_everywhere(tracker.states, factor):  # else `_record` needs no site
            frame = _report.user_frame()
            pending["site"] = None if frame is None else (frame.f_code, frame.f_lineno)

    def after_backward(states, **_) -> None:
        if "factor" not in pending:
            return
        factor, site = pending.pop("factor"), pending.pop("site")
        for st in states:
            if st.prepared_by is None:
                _record(st, factor, site)

    # sampled windows only: how a loop divides its losses does not change from window to
    # window, and the graph read costs tens of microseconds on a micro-step's cold caches
    tracker.subscribe("backward_pre", before_backward, sampled=True)
    tracker.subscribe("backward", after_backward, sampled=True)
    tracker.subscribe("unscale_pre", lambda state, **_: _note_rescaled(state))
    tracker.subscribe("unscale", lambda state, **_: _remember_grads(state))
    tracker.subscribe("clip", _before_clip)
    tracker.subscribe("clip_done", _after_clip)
    tracker.subscribe("optimizer_step_pre", _before_step)
    tracker.subscribe("optimizer_step", lambda state, **_: _forget([state]))
    tracker.subscribe("zero_grad", _forget)


def _record(st, factor: float | None, site) -> None:
    state = st.of(LossDivision)
    data = state.window
    if data is None:
        if _divides(st, factor):  # the usual first pass of a window: no bookkeeping needed
            state.window = _Window(divided=True)
            return
        data = state.window = _Window()
    if data.divided:
        return
    if _divides(st, factor):
        data.divided = True
        return
    data.factors.append(factor)
    data.sites[site] += 1
    if len(data.factors) >= 2:
        data.watching, data.grads = True, _grad_norm(st)


def _divides(st, factor: float | None) -> bool:
    """A pass with this factor divides st's window (by the previous window's k); unreadable
    graphs count as divided: never a guess."""
    previous_k = st.of(LossDivision).previous_k
    return factor is None or (previous_k >= 2 and factor * previous_k <= _DIVIDED)


def _divides_everywhere(states, factor: float | None) -> bool:
    """The pass divides the window of every raw optimizer it may reach, so the stack walk for
    its backward line (tens of microseconds) is not needed."""
    for st in states:
        if st.prepared_by is None and not _divides(st, factor):
            return False
    return True


def _all_divided(states) -> bool:
    """Every optimizer already had a divided pass this window: no later pass can be reported,
    so the graph walk and the frame lookup are skipped."""
    for st in states:  # a loop, not all(generator): this runs every micro-step
        window = st.of(LossDivision).window
        if (window is None or not window.divided) and st.prepared_by is None:
            return False
    return bool(states)


def _forget(states, **_) -> None:
    for st in states:
        st.of(LossDivision).window = None


def _probe_param(st):
    """One trainable parameter of the optimizer whose gradient norm is watched."""
    state = st.of(LossDivision)
    ref = state.probe
    param = ref() if ref is not None else None
    if param is None:
        optimizer = st.optimizer
        groups = getattr(optimizer, "param_groups", []) if optimizer is not None else []
        param = next((p for g in groups for p in g["params"] if p.requires_grad), None)
        if param is not None:
            state.probe = weakref.ref(param)
    return param


def _grad_norm(st):
    """The probe gradient's norm as a device tensor (no host read), None if unreadable."""
    param = _probe_param(st)
    if param is None or param.grad is None or param.grad.is_sparse:
        return None
    return torch.linalg.vector_norm(param.grad.detach())


def _rescaled(st, data: _Window) -> bool:
    """Whether the probe gradient changed since it was last remembered (one host read)."""
    before, now = data.grads, _grad_norm(st)
    return before is None or now is None or bool(before != now)


def _remember_grads(st) -> None:
    data = st.of(LossDivision).window
    if data is not None and data.watching:
        data.grads = _grad_norm(st)


def _note_rescaled(st) -> None:
    """Before an unscale or a clip changes the gradients for its own reasons: were they already
    rescaled by the user since the last backward (`p.grad /= k` before `scaler.unscale_`)?"""
    data = st.of(LossDivision).window
    if data is not None and data.watching and not data.rescaled:
        data.rescaled = _rescaled(st, data)


def _before_clip(kind, states, **_) -> None:
    for st in states:
        data = st.of(LossDivision).window
        if kind == "norm" and data is not None and data.watching:
            _note_rescaled(st)
            data.clean_before_clip = not data.rescaled


def _after_clip(kind, states, result, limit, **_) -> None:
    """A norm clip hides the missing division only when the divided gradients would have been
    clipped to the same limit (total norm / k >= max_norm): then the update is identical. Else
    the clip does not count as the rescaling that makes the window right (unless the gradients
    had already been rescaled before it)."""
    if kind != "norm" or limit is None:
        return
    pending = [st for st in states if _clean_before_clip(st.of(LossDivision).window)]
    if not pending:
        return
    norm = float(result)  # one host read, only in a window that can still be reported
    for st in pending:
        k = max(st.of(LossDivision).window.sites.values(), default=1)
        if norm / k < float(limit):
            _remember_grads(st)


def _clean_before_clip(data: _Window | None) -> bool:
    """Whether a norm clip started on gradients the user did not rescale (asked once)."""
    if data is None or not data.clean_before_clip:
        return False
    data.clean_before_clip = False
    return True


def _before_step(state, **_) -> None:
    data = state.of(LossDivision).window
    if data is None or data.divided:
        return
    k = max(data.sites.values(), default=0)
    state.of(LossDivision).previous_k = k
    if k < 2 or any(factor * k <= _DIVIDED or factor > 1 for factor in data.factors):
        return  # divided by about k, or scaled up on purpose
    if data.rescaled or _rescaled(state, data):
        return  # gradients were rescaled after the last backward (e.g. p.grad /= k)
    report(
        "ACL301",
        f"{k} micro-batches contributed to this optimizer step through the same backward call, "
        f"none divided by {k}: the update uses the sum of {k} mean gradients ({k}x the "
        f"large-batch mean); divide each loss by the accumulation steps (loss / {k}) or the "
        "gradients before the step",
        level="warning",
    )
