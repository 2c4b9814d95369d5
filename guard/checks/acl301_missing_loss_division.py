"""ACL301 (heuristic warning): k > 1 backward passes summed into one optimizer step, none divided.

At each backward the root of the loss graph is read for a constant factor (`loss / k`,
`loss * (1 / k)`; Accelerate's own `/ N` counts), until the window has one divided pass (the
window cannot be reported then, so the rest of it costs nothing). At the step, if k > 1 passes
contributed and every one had factor 1, and the gradients were not modified in place since the
last backward (`p.grad.div_(k)`, read through the private `Tensor._version`), the update uses the
sum of k mean gradients. The engine always divides, so its loops cannot hit this.
"""

from __future__ import annotations

import weakref

from guard import _private
from guard.checks import _graph
from guard.checks._common import report

CODES = ("ACL301",)
_KEY = "ACL301"
_UNSEEN = {"divided": 0}


def install(tracker) -> None:
    pending: dict[str, float | None] = {}

    def before_backward(tensors, scaled_by, via, **_) -> None:
        if not tensors or via == "engine" or _all_divided(tracker.states):
            pending["factor"] = None  # the engine normalises itself: counts as divided
        else:
            pending["factor"] = _graph.root_factor(tensors[0], scaled=scaled_by is not None)

    def after_backward(states, **_) -> None:
        factor = pending.pop("factor", 1.0)
        for st in states:
            data = st.extra.get(_KEY)
            if data is None:
                data = st.extra[_KEY] = {"undivided": 0, "divided": 0}
            data["divided" if factor is None or factor != 1.0 else "undivided"] += 1
            if not data["divided"] and data["undivided"] >= 2:  # else the step cannot report
                data["version"] = _grad_version(st)

    tracker.subscribe("backward_pre", before_backward)
    tracker.subscribe("backward", after_backward)
    tracker.subscribe("unscale", lambda state, **_: _remember_version(state))
    tracker.subscribe("optimizer_step_pre", _before_step)
    tracker.subscribe("optimizer_step", lambda state, **_: state.extra.pop(_KEY, None))
    tracker.subscribe("zero_grad", _forget)


def _all_divided(states) -> bool:
    """Every optimizer already had a divided pass this window: no later pass can be reported,
    so the graph walk (a few microseconds per micro-step) is skipped."""
    for st in states:  # a loop, not all(generator): this runs every micro-step
        if not st.extra.get(_KEY, _UNSEEN)["divided"]:
            return False
    return bool(states)


def _forget(states, **_) -> None:
    for st in states:
        st.extra.pop(_KEY, None)


def _probe_param(st):
    """One trainable parameter of the optimizer whose `.grad` version is watched."""
    ref = st.extra.get("ACL301_probe")
    param = ref() if ref is not None else None
    if param is None:
        optimizer = st.optimizer
        groups = getattr(optimizer, "param_groups", []) if optimizer is not None else []
        param = next((p for g in groups for p in g["params"] if p.requires_grad), None)
        if param is not None:
            st.extra["ACL301_probe"] = weakref.ref(param)
    return param


def _grad_version(st) -> int | None:
    param = _probe_param(st)
    if param is None or param.grad is None:
        return None
    return _private.tensor_version(param.grad, "ACL301's gradient-division check")


def _remember_version(st) -> None:
    data = st.extra.get(_KEY)
    if data is not None:
        data["version"] = _grad_version(st)


def _before_step(state, **_) -> None:
    data = state.extra.get(_KEY)
    if not data or data["divided"] or data["undivided"] < 2:
        return
    version = data.get("version")
    if version is None or _grad_version(state) != version:
        return  # gradients were rescaled in place after the last backward (e.g. p.grad /= k)
    k = data["undivided"]
    report(
        "ACL301",
        f"{k} backward passes contributed to this optimizer step, none divided by {k}: the "
        f"update uses the sum of {k} mean gradients ({k}x the large-batch mean); divide each "
        f"loss by the accumulation steps (loss / {k}) or the gradients before the step",
        level="warning",
    )
