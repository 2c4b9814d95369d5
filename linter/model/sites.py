"""Sites and regions: the calls rules care about (backward, steps, clip, unscale, zero_grad,
gradient divisions) and the `with` regions around them (accumulate, autocast, no_sync)."""

from __future__ import annotations

import libcst as cst

from linter.model.cst_util import code, dotted, keyword, last_part, method_call, positional
from linter.model.functions import Scope
from linter.model.kinds import RegionKind, SiteKind
from linter.model.loops import Region, Site
from linter.model.roles import Roles

CLIP_FUNCTIONS = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_gradients"}
AUTOCAST = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.amp.autocast_mode.autocast",
}


class SiteFinder:
    def __init__(
        self, roles: Roles, imports, module_defs, local_function=None, local_context=None
    ) -> None:
        self.roles = roles
        self.imports = imports
        self.module_defs = module_defs
        # the module's own function a call refers to (`self.backward(loss)` of a trainer)
        self.local_function = local_function or (lambda func, scope: None)
        # (kind, call) a context manager of the module enters (`with MixedPrecision():`)
        self.local_context = local_context or (lambda call: None)

    def sites(self, scope: Scope) -> list[Site]:
        """Every site of one scope, in statement order."""
        found = [site for c in scope.calls if (site := self._site(c)) is not None]
        found += self._grad_divisions(scope)
        found.sort(key=lambda s: s.stmt.order)
        return found

    def regions(self, scope: Scope) -> list[Region]:
        regions = []
        for with_node, frames in scope.withs:
            for item in with_node.items:
                call = item.item if isinstance(item.item, cst.Call) else self._context(item, scope)
                if call is None:
                    continue
                kind = self.region_kind(call, scope)
                if kind is None and (entered := self.local_context(call)) is not None:
                    kind, call = entered  # the autocast its `__enter__` enters
                if kind is not None:
                    pair = method_call(call)
                    receiver = dotted(pair[0]) if pair else None
                    via_name = call is not item.item
                    regions.append(Region(kind, with_node, item, call, receiver, frames, via_name))
        return regions

    def region_kind(self, call: cst.Call, scope: Scope) -> RegionKind | None:
        qual = self.imports.qualify(call.func) or ""
        if qual in AUTOCAST or (qual == "autocast"):
            return RegionKind.AUTOCAST
        pair = method_call(call)
        if pair is None:
            return None
        receiver, method = dotted(pair[0]), pair[1]
        if method == "no_sync":
            return RegionKind.NO_SYNC
        if method in ("accumulate", "autocast") and self.roles.engine_for(receiver, scope):
            return RegionKind.ACCUMULATE if method == "accumulate" else RegionKind.ENGINE_AUTOCAST
        return None

    def _site(self, c) -> Site | None:
        scope = c.stmt.scope
        method, receiver = c.method, c.receiver
        qual = self.imports.qualify(c.call.func) or ""
        roles = self.roles
        kind = None
        if method == "backward" and not self.imports.is_imported(c.call.func):
            if self.local_function(c.call.func, scope) is not None:
                return None  # the trainer's own method: its body's sites are its own
            kind = (
                SiteKind.ENGINE_BACKWARD if self._engine_backward(c, scope) else SiteKind.BACKWARD
            )
        elif qual == "torch.autograd.backward":
            kind = SiteKind.BACKWARD
        elif method == "manual_backward" and positional(c.call):
            kind = SiteKind.ENGINE_BACKWARD  # a LightningModule's backward in manual optimization
        elif method == "step":
            kind = self._step_kind(receiver, scope)
        elif method == "update" and roles.scaler_role(receiver, scope):
            kind = SiteKind.SCALER_UPDATE
        elif method == "unscale_" and roles.scaler_role(receiver, scope):
            kind = SiteKind.UNSCALE
        elif method == "unscale_gradients" and roles.engine_for(receiver, scope):
            kind = SiteKind.UNSCALE
        elif last_part(qual) in CLIP_FUNCTIONS and self._is_clip(qual, method, receiver, scope):
            kind = SiteKind.CLIP
        elif method == "zero_grad":
            kind = SiteKind.ZERO_GRAD
        elif method in ("div_", "mul_") and ".grad" in (receiver or ""):
            kind = SiteKind.GRAD_DIV
        elif qual in ("torch._foreach_div_", "torch._foreach_mul_"):
            kind = SiteKind.GRAD_DIV
        if kind is None:
            return None
        return Site(kind, c.call, c.stmt, receiver)

    def _engine_backward(self, c, scope: Scope) -> bool:
        """`engine.backward(loss)`: a known engine, or any receiver handed a loss.

        `Tensor.backward` takes a gradient positionally (`out.backward(torch.ones_like(out))`);
        a positional loss (`fabric.backward(loss)`, a DeepSpeed `model.backward(loss)`), or a
        `loss=` keyword, which `Tensor.backward` does not have (ColossalAI's
        `booster.backward(loss=..., optimizer=...)`), means an engine's backward, whose scaling
        and division the linter cannot see.
        """
        if not c.call.args:
            return False
        if keyword(c.call, "loss") is not None:
            return True
        if self.roles.engine_for(c.receiver, scope) is not None:
            return True
        args = positional(c.call)
        return bool(args) and "loss" in code(args[0]).lower()

    def _step_kind(self, receiver: str | None, scope: Scope) -> SiteKind | None:
        if self.roles.scaler_role(receiver, scope):
            return SiteKind.SCALER_STEP
        if self.roles.is_scheduler(receiver):
            return SiteKind.SCHED_STEP
        if self.roles.is_optimizer(receiver):
            return SiteKind.OPT_STEP
        return None

    def _is_clip(self, qual: str, method, receiver, scope: Scope) -> bool:
        if method is None:
            return qual.startswith("torch.nn.utils") or "." not in qual
        if qual.startswith("torch.nn.utils"):
            return True
        return self.roles.engine_for(receiver, scope) is not None or "model" in (receiver or "")

    def _grad_divisions(self, scope: Scope) -> list[Site]:
        """`p.grad /= N` / `p.grad *= 1 / N`: gradients divided instead of the loss."""
        found = []
        for name, defs in scope.defs.items():
            if ".grad" in name or name.endswith("grad"):
                for d in defs:
                    if d.op in ("/=", "*=") or (d.op == "=" and "/" in code(d.value)):
                        found.append(Site(SiteKind.GRAD_DIV, None, d.stmt, name, d.stmt.node))
        return found

    def _context(self, item: cst.WithItem, scope: Scope) -> cst.Call | None:
        """The autocast call behind `with ctx:` (nanoGPT: `ctx = nullcontext() if cpu else
        torch.amp.autocast(...)`)."""
        text = dotted(item.item)
        defs = scope.defs.get(text or "") or self.module_defs(text or "")
        if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
            return None
        value = defs[0].value
        options = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        for option in options:
            if (
                isinstance(option, cst.Call)
                and self.region_kind(option, scope) == RegionKind.AUTOCAST
            ):
                return option
        return None
