"""ACL106: a backward through an fp16 autocast forward with no GradScaler.

Gradients below fp16's smallest subnormal (about 6e-8) flush to zero without any error. Only a
forward whose fp16 outputs are part of the backward's graph matters: a frozen fp16 teacher (its
outputs carry no graph) or an fp16 evaluation that is never backpropagated is not fp16 training.
So while an fp16 autocast region entered with gradients enabled is open, a global module forward
hook tags the autograd node of every fp16 module output that records a graph (a few microseconds per
module call inside such regions, scaled fp16 training included). An unscaled backward whose graph
reaches a tagged node is reported: through the engine, an error before autograd runs; in raw loops a
warning, judged at the optimizer's step and named after the backward's line and step. A loop whose
GradScaler unscales or steps that optimizer has a scaler the backward skipped: ACL101 reports that,
and ACL106 stays silent (one root cause, one finding). The walk over the graph runs only when
something was tagged since the previous backward, and stops at the first tagged node. Forwards that
call no `nn.Module` inside the region (purely functional code) are not seen.

"""

from __future__ import annotations

import weakref

import torch

from guard import _patch, _report, sources
from guard.checks._common import output_tensors, report

CODES = ("ACL106",)
_TAG = "accel_guard.fp16_forward"


class _Fp16Forwards:
    """The forward hook (installed while an fp16 region is open) and what it tagged."""

    def __init__(self, tracker) -> None:
        self.tracker = tracker
        self.hook = None
        self.tagged = 0  # fp16 graph-recording module outputs tagged since the last backward
        self.unjudged: tuple | None = None  # (region, location, step) of this backward's finding
        self.waiting: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # OptState ->
        #                                       finding, until that optimizer's step

    def region_entered(self, dtype, enabled, **_) -> None:
        wanted = enabled and dtype == torch.float16 and torch.is_grad_enabled()
        if wanted and self.hook is None:
            register = torch.nn.modules.module.register_module_forward_hook
            self.hook = register(self._after_forward)

    def region_left(self, **_) -> None:
        if not any(f.enabled and f.dtype == torch.float16 for f in self.tracker.autocast_stack):
            self.remove()

    def remove(self) -> None:
        """Drop the hook (also called by `guard.uninstall()` through `_patch.track`)."""
        if self.hook is not None:
            self.hook.remove()
            self.hook = None

    def _after_forward(self, _module, _args, output) -> None:
        for t in output_tensors(output):
            if t.dtype == torch.float16 and t.grad_fn is not None:
                t.grad_fn.metadata[_TAG] = self._region()
                self.tagged += 1

    def _region(self) -> tuple[str | None, str]:
        """Where the innermost open fp16 region was entered (the user's `with` line), and who
        entered it ("user", "engine", "accelerate", "accelerate-forward")."""
        for frame in reversed(self.tracker.autocast_stack):
            if frame.enabled and frame.dtype == torch.float16:
                return frame.location, frame.origin
        return None, "user"

    def before_backward(self, tensors, scaled_by, via, **_) -> None:
        tagged, self.tagged = self.tagged, 0
        if not tagged or scaled_by is not None:
            return
        found, (region, origin) = _find_tag([t.grad_fn for t in tensors])
        if found and via == "raw" and origin != "user":
            return  # a raw backward through the engine's or Accelerate's fp16: ACL101 reports it
        if found and via == "engine":
            _report_fp16(region, "error")
        elif found:  # judged at the step: a GradScaler stepping it means ACL101's mistake
            self.unjudged = (region, _report.user_location(), _report.current_step())

    def after_backward(self, states, **_) -> None:
        if self.unjudged is None:
            return
        finding, self.unjudged = self.unjudged, None
        if not states:  # no optimizer will step these gradients: nothing to wait for
            _report_deferred(finding)
        for st in states:
            self.waiting[st] = finding

    def scaler_steps(self, state, **_) -> None:
        """A raw backward in a loop whose GradScaler unscales or steps this optimizer: the
        loop has a scaler and that backward skipped it, which ACL101 reports (one root cause,
        one finding)."""
        self.waiting.pop(state, None)

    def plain_step(self, state, in_scaler_step, **_) -> None:
        finding = self.waiting.pop(state, None)
        if finding is not None and not in_scaler_step:
            _report_deferred(finding)

    def finish(self, **_) -> None:
        waiting = list(self.waiting.values())
        self.waiting.clear()
        for finding in waiting:
            _report_deferred(finding)


def _report_deferred(finding: tuple) -> None:
    """At the backward's line and step, although judged later. Not after an ACL101 (raised
    at a scaler step before this check heard of it): the same backward skipped the scaler."""
    if any(f.code == "ACL101" for f in _report.findings()):
        return
    region, location, step = finding
    with _report.at_step(step, location):
        _report_fp16(region, "warning")


def _report_fp16(region: str | None, level) -> None:
    report(
        "ACL106",
        f"backward through a forward that ran under fp16 autocast ({region or '?'}) "
        "without a GradScaler: gradients below ~6e-8 become zero; use "
        "dtype=torch.bfloat16, or keep fp16 and use scaler.scale(loss).backward() with "
        "scaler.step/update",
        level,
    )


def install(tracker) -> None:
    sources.ensure(tracker, "finish")
    forwards = _patch.track(_Fp16Forwards(tracker))
    tracker.subscribe("autocast_enter", forwards.region_entered)
    # bf16 regions never tag anything: only an fp16 region wakes the per-micro-step parts
    tracker.subscribe("autocast_exit", forwards.region_left, when="fp16-autocast")
    tracker.subscribe("backward_pre", forwards.before_backward, when="fp16-autocast")
    tracker.subscribe("backward", forwards.after_backward, when="fp16-autocast")
    tracker.subscribe("unscale_pre", forwards.scaler_steps, when="fp16-autocast")
    tracker.subscribe("scaler_step_pre", forwards.scaler_steps, when="fp16-autocast")
    tracker.subscribe("optimizer_step_pre", forwards.plain_step, when="fp16-autocast")
    tracker.subscribe("finish", forwards.finish, when="fp16-autocast")


def _find_tag(roots: list) -> tuple[bool, tuple[str | None, str]]:
    """Whether a tagged node lies in the graph below `roots` (depth-first, each node once), and
    the region location it was tagged with."""
    seen: set = set()
    stack = [node for node in roots if node is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        metadata = node.metadata
        if _TAG in metadata:
            return True, metadata[_TAG]
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return False, (None, "user")
