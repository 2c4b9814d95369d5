"""The training-loop model: what a reviewer knows about a module before judging it.

`Model(module)` is built once per file; rules ask it questions (which loop owns this backward,
is this statement on the update step, which engine is in scope here) instead of re-walking the CST.
"""

from __future__ import annotations

import re
from functools import partial

import libcst as cst

from linter.model.cst_util import code, dotted, last_part, method_call, positional, strip_parens
from linter.model.dataflow import Flow, trace_loss
from linter.model.functions import (
    CallSite,
    Def,
    Scope,
    ScopeCollector,
    Stmt,
    bound_arguments,
)
from linter.model.loops import (
    STEP_KINDS,
    Gate,
    Region,
    Site,
    TrainingLoop,
    caller_gate,
    find_training_loops,
    inline_gate,
    same_path,
    step_gate,
    update_gate,
)
from linter.model.names import Imports
from linter.model.positions import Positions
from linter.model.setup import ENGINE_CLASSES, Engine, SetupCollector

__all__ = ["Model", "Site", "TrainingLoop", "Gate", "Region", "Flow", "Stmt", "Scope"]

_ENGINE_NAME = re.compile(r"^(accelerator|accel|engine|model_engine|\w+_engine|fabric)$")
_OPTIMIZER_NAME = re.compile(r"(^|_)(opt|optim|optimizer|optimiser)(s|_\w+|\d+)?$|optimizer")
_SCHEDULER_NAME = re.compile(r"sched")
_K_NAME = re.compile(r"grad(ient)?_?acc|accum", re.I)  # the Conventions' accumulation value
_LIGHTNING_PACKAGES = {"lightning", "pytorch_lightning"}
_CLIP_FUNCTIONS = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_gradients"}
_AUTOCAST = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.amp.autocast_mode.autocast",
}


class Model:
    def __init__(self, module: cst.Module, source: str | None = None) -> None:
        self.module = module
        self.positions = Positions(module, source)
        collector = ScopeCollector(module)
        self.scopes = collector.scopes
        self.function_defs = collector.function_defs
        self.imports = Imports()
        for node in collector.imports:
            self.imports.add(node)
        self._defs: dict[str, list[Def]] = {}
        for scope in self.scopes:
            for name, defs in scope.defs.items():
                self._defs.setdefault(name, []).extend(defs)
        self.calls = [c for scope in self.scopes for c in scope.calls]
        self._partials: dict[str, tuple[Scope, int]] = {}
        self._partials = self._find_partials()
        self._callers: dict[int, list[CallSite]] = {}
        for call in self.calls:
            callee = self.local_function(call.call.func, call.stmt.scope)
            if callee is not None:
                self._callers.setdefault(id(callee), []).append(call)
        self.setup = SetupCollector(self.scopes, self.imports).setup
        self._stepped = {code(positional(c.call)[0]) for c in self.calls if self._scaler_step(c)}
        self.sites: dict[int, list[Site]] = {}
        self.loops: list[TrainingLoop] = []
        self.regions: list[Region] = []
        self._calls_by_with: dict[int, list] | None = None
        for scope in self.scopes:
            sites = [site for c in scope.calls if (site := self._site(c)) is not None]
            sites += self._grad_divisions(scope)
            sites.sort(key=lambda s: s.stmt.order)
            self.sites[id(scope)] = sites
            self.loops.extend(find_training_loops(scope, sites, self._called_in_loop(scope)))
            self.regions.extend(self._regions(scope))
        for loop in self.loops:
            if loop.gate is None:
                loop.gate = self._accumulate_gate(loop)
            if loop.gate is None and not loop.steps:
                loop.gate = self._helper_step_gate(loop)
            if loop.gate is None and not loop.steps and isinstance(loop.node, cst.FunctionDef):
                loop.gate = self._caller_gate(loop.scope)

    def _helper_step_gate(self, loop: TrainingLoop) -> Gate | None:
        """The gate of a call, in the loop, of a module function that steps the optimizer
        (`if not (i + 1) % K: step()` with `def step(): scaler.step(opt); ...`)."""
        for call in self._step_helper_calls(loop):
            for frame in reversed(loop.frames_of(call.stmt)):
                gate = update_gate(frame, loop.counters, loop.flags)
                if gate is not None:
                    return gate
        return None

    def step_helper_sites(self, loop: TrainingLoop, *kinds: str) -> list[tuple[Stmt, Site]]:
        """(the call in the loop, a site of `kinds` in the called function) for the module
        functions the loop steps through: `p.grad /= K` inside `def step():` divides too."""
        return [
            (call.stmt, site)
            for call in self._step_helper_calls(loop)
            for site in self.sites[id(self.local_function(call.call.func, call.stmt.scope))]
            if site.kind in kinds
        ]

    def _step_helper_calls(self, loop: TrainingLoop):
        """Calls, in the loop's own body, of module functions that step an optimizer."""
        for callee in self.scopes:
            if not any(s.kind in STEP_KINDS for s in self.sites[id(callee)]):
                continue
            for call in self._callers.get(id(callee), ()):
                in_loop = any(f.node is loop.node for f in call.stmt.frames)
                if call.stmt.scope is loop.scope and in_loop:
                    yield call

    def _caller_gate(self, scope: Scope) -> Gate | None:
        """The step gate of the loop that calls this per-batch function, when that loop steps
        the optimizer itself or through another of the module's functions."""
        steps = [s.stmt for sites in self.sites.values() for s in sites if s.kind in STEP_KINDS]
        for callee in self.scopes:
            if any(s.kind in STEP_KINDS for s in self.sites[id(callee)]):
                steps.extend(call.stmt for call in self._callers.get(id(callee), ()))
        for call in self._callers.get(id(scope), ()):
            gate = caller_gate(call.stmt, steps)
            if gate is not None:
                return gate
        return None

    def _find_partials(self) -> dict[str, tuple[Scope, int]]:
        """Names bound once to `functools.partial(f, ...)` of a module function: (f, the number
        of positional arguments the partial already binds)."""
        found = {}
        for name, defs in self._defs.items():
            if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
                continue
            value = defs[0].value
            if not isinstance(value, cst.Call) or not positional(value):
                continue
            if self.imports.qualify(value.func) != "functools.partial":
                continue
            callee = self.local_function(positional(value)[0], defs[0].stmt.scope)
            if callee is not None:
                found[name] = (callee, len(positional(value)) - 1)
        return found

    def argument_sites(self, scope: Scope, param: str) -> list[tuple[cst.BaseExpression, Stmt]]:
        """(expression passed for `param`, the calling statement) at this module's calls of the
        function, directly or through a `partial`."""
        if param not in scope.params:
            return []
        names = list(scope.params)
        if scope.class_name is not None and names and names[0] in ("self", "cls"):
            names = names[1:]
        found = []
        for call in self._callers.get(id(scope), ()):
            args = call.call.args
            by_keyword = [a.value for a in args if a.keyword and a.keyword.value == param]
            partial = self._partials.get(call.func or "")
            position = names.index(param) - (partial[1] if partial else 0)
            positional_args = [a.value for a in args if a.keyword is None and not a.star]
            if by_keyword:
                found.append((by_keyword[0], call.stmt))
            elif 0 <= position < len(positional_args):
                found.append((positional_args[position], call.stmt))
        return found

    def _called_in_loop(self, scope: Scope) -> bool:
        """Whether this module calls the function from inside a loop (a per-batch step), or
        the function is a Lightning module's `training_step`, which the trainer calls per
        batch."""
        if not isinstance(scope.node, cst.FunctionDef):
            return False
        if scope.name == "training_step" and scope.class_name and self._imports_lightning():
            return True
        return any(call.stmt.loops() for call in self._callers.get(id(scope), ()))

    def _imports_lightning(self) -> bool:
        return any(
            full.split(".", 1)[0] in _LIGHTNING_PACKAGES for full in self.imports.aliases.values()
        )

    # names and roles ---------------------------------------------------------------
    def module_defs(self, text: str) -> list[Def]:
        return self._defs.get(text, [])

    def engine_for(self, text: str | None, scope: Scope | None = None) -> Engine | None:
        """The engine an expression holds (a known one, or one recognised by name/annotation)."""
        if not text:
            return None
        if text in self.setup.engines:
            return self.setup.engines[text]
        if scope is not None and text in scope.params:
            annotation = scope.params[text].annotation
            qual = self.imports.qualify(annotation.annotation) if annotation else None
            if last_part(qual) in ENGINE_CLASSES:
                return Engine(text, ENGINE_CLASSES[last_part(qual)], scope.params[text])
            for arg in bound_arguments(scope, text, self.calls):
                if dotted(arg) in self.setup.engines:
                    return self.setup.engines[dotted(arg)]
        if _ENGINE_NAME.match(last_part(text)):
            kind = "accelerate" if "accel" in text else "fabric" if "fabric" in text else "unknown"
            return Engine(text, kind, None)
        return None

    def scaler_role(self, text: str | None, scope: Scope | None = None) -> str | None:
        """ "enabled" / "disabled" for an expression holding a GradScaler, else None."""
        if not text:
            return None
        known = self.setup.scalers.get(text)
        if known is not None:
            return "disabled" if known.enabled is False else "enabled"
        if scope is not None and text in scope.params:
            bound = [dotted(a) for a in bound_arguments(scope, text, self.calls)]
            roles = {self.scaler_role(b) for b in bound if b}
            if roles == {"disabled"}:
                return "disabled"
            if "enabled" in roles:
                return "enabled"
        if "scaler" in last_part(text).lower():
            same = [s for s in self.setup.scalers.values() if last_part(s.name) == last_part(text)]
            if same and all(s.enabled is False for s in same):
                return "disabled"
            return "enabled"
        return None

    def is_prepared(self, text: str | None, scope: Scope, order: int | None = None) -> bool:
        """Whether a name in `scope` (before statement `order`, when given) holds an object that
        went through `prepare(...)`."""
        if text not in self.setup.prepared:
            return False
        return self._holds_prepared(text, scope, order, False, 0)

    def prepared_in_reach(self, scope: Scope, depth: int = 0) -> bool:
        """Whether code in `scope` can see a prepared object at all: a `prepare(...)` in this
        function, an enclosing one or the module, in another method of its class, or in a
        function that calls it. A loss of unknown origin in a function out of reach of every
        prepare (a helper beside the one that prepares) is not the engine's."""
        holders = [d.stmt.scope for d in self.setup.prepared_defs]
        enclosing = scope
        while enclosing is not None:
            if any(h is enclosing for h in holders):
                return True
            enclosing = enclosing.parent
        if scope.class_name is not None and any(h.class_name == scope.class_name for h in holders):
            return True
        if depth >= _MAX_RESOLVE_DEPTH:
            return False
        callers = self._callers.get(id(scope), ())
        return any(self.prepared_in_reach(call.stmt.scope, depth + 1) for call in callers)

    def derives_from_prepared(self, text: str | None, scope: Scope) -> bool:
        """Prepared, or built from a prepared object: `diffusion = MedSegDiff(model).to(dev)`
        runs the prepared `model` inside its own forward."""
        return bool(text) and self._holds_prepared(text, scope, None, True, 0)

    def _holds_prepared(
        self,
        text: str,
        scope: Scope,
        order: int | None,
        wrappers: bool,
        depth: int,
        unknown: bool = True,
    ) -> bool:
        """Resolve a name as Python does: the assignments of its own function (those before
        `order`), else the arguments its callers pass for a parameter, else the enclosing
        function or the module. `unknown` answers for a name whose value cannot be seen (a
        parameter of a function called from elsewhere)."""
        if depth > _MAX_RESOLVE_DEPTH:
            return unknown and text in self.setup.prepared
        defs = self._visible_defs(text, scope, order)
        if defs:
            return any(self._def_holds_prepared(d, wrappers, depth, unknown) for d in defs)
        if "." in text:
            return False
        if text in scope.params:
            sites = self.argument_sites(scope, text)
            if not sites:  # a function that prepares its own objects left this one alone
                return unknown and not self._prepares_in(scope)
            return any(
                self._argument_holds_prepared(e, s, wrappers, depth + 1, unknown) for e, s in sites
            )
        if scope.parent is not None:
            return self._holds_prepared(text, scope.parent, None, wrappers, depth, unknown)
        return unknown and text in self.setup.prepared

    def _prepares_in(self, scope: Scope) -> bool:
        """Whether `scope` itself assigns the result of a `prepare(...)` call."""
        return any(d.stmt.scope is scope for d in self.setup.prepared_defs)

    def _visible_defs(self, text: str, scope: Scope, order: int | None) -> list[Def]:
        """The assignments that may bind `text` at this point of `scope`: the last one before
        `order`, or all of them (a loop may carry any of them around)."""
        if "." in text:
            local = scope.defs.get(text)
            return local if local else self.module_defs(text)
        defs = list(scope.defs.get(text, ()))
        if scope.parent is None:
            defs += [d for s in self.scopes if text in s.globals for d in s.defs.get(text, ())]
        if order is not None:
            before = [d for d in defs if d.stmt.order < order]
            if before:
                return before[-1:]
            if text in scope.params:
                return []
        return defs

    def _def_holds_prepared(self, d: Def, wrappers: bool, depth: int, unknown: bool) -> bool:
        if d in self.setup.prepared_defs:
            return True
        if not wrappers or d.op != "=":
            return False
        return self._value_holds_prepared(d.value, d.stmt.scope, d.stmt.order, depth + 1, unknown)

    def _value_holds_prepared(
        self, value, scope: Scope, order: int, depth: int, unknown: bool
    ) -> bool:
        """`model.to(dev)` of a prepared model, or `Wrapper(model, ...)` built from one (the
        arguments of a constructor count only when visibly prepared)."""
        text = dotted(value)
        if text is not None:
            return self._holds_prepared(text, scope, order, True, depth, unknown)
        if not isinstance(value, cst.Call) or depth > _MAX_RESOLVE_DEPTH:
            return False
        if _is_prepare_call(value):
            return True
        pair = method_call(value)
        if pair is not None and pair[1] in _MOVES:
            return self._value_holds_prepared(pair[0], scope, order, depth + 1, unknown)
        return any(
            self._value_holds_prepared(a.value, scope, order, depth + 1, False) for a in value.args
        )

    def _argument_holds_prepared(
        self, expr, stmt: Stmt, wrappers: bool, depth: int, unknown: bool
    ) -> bool:
        text = dotted(expr)
        if text is not None:
            return self._holds_prepared(text, stmt.scope, stmt.order, wrappers, depth, unknown)
        if not isinstance(expr, cst.Call):
            return unknown
        if wrappers:
            return self._value_holds_prepared(expr, stmt.scope, stmt.order, depth, unknown)
        return _is_prepare_call(expr)

    def scale_loss_source(self, name: str, scope: Scope) -> cst.BaseExpression | None:
        """`X` for a name bound by apex's `with amp.scale_loss(X, opt) as name:`."""
        for with_node, _ in scope.withs:
            for item in with_node.items:
                target = item.asname.name if item.asname is not None else None
                pair = method_call(item.item)
                if dotted(target) == name and pair is not None and pair[1] == "scale_loss":
                    args = positional(item.item)
                    return args[0] if args else None
        return None

    def is_optimizer(self, text: str | None) -> bool:
        if not text:
            return False
        if text in self.setup.optimizers or text in self._stepped:
            return True
        return bool(_OPTIMIZER_NAME.search(last_part(text).lower()))

    def is_scheduler(self, text: str | None) -> bool:
        if not text:
            return False
        return text in self.setup.schedulers or bool(_SCHEDULER_NAME.search(last_part(text)))

    def local_function(self, func: cst.BaseExpression, scope: Scope) -> Scope | None:
        """The module's own function (or method of the same class) a call refers to."""
        text = dotted(func)
        if text is None:
            return None
        if text in self._partials:
            return self._partials[text][0]
        if "." not in text:
            candidates = [s for s in self.function_defs.get(text, ()) if s.class_name is None]
        elif text.startswith("self.") and text.count(".") == 1 and scope.class_name:
            name = text.split(".", 1)[1]
            candidates = [
                s for s in self.function_defs.get(name, ()) if s.class_name == scope.class_name
            ]
        else:
            return None
        return candidates[0] if len(candidates) == 1 else None

    def defines_function(self, func: cst.BaseExpression) -> bool:
        """Whether the callee is named like one of this module's own functions or methods."""
        text = dotted(func)
        if text is None:
            return False
        if "." not in text:
            return text in self.function_defs
        return text.startswith("self.") and text.split(".", 1)[1] in self.function_defs

    def engine_in_scope(self, scope: Scope) -> str | None:
        """An expression for the engine usable at this point of `scope`, for autofixes."""
        texts = [t for t, e in self.setup.engines.items() if e.kind in ("accelerate", "guard")]
        for text in texts:
            if text in scope.defs:
                return text
        for name in scope.params:
            engine = self.engine_for(name, scope)
            if engine is not None and engine.kind != "deepspeed":
                return name
        if scope.class_name is not None:
            for text in texts:
                if text.startswith("self.") and self._assigned_in_class(text, scope.class_name):
                    return text
        for text in texts:
            if "." not in text and any(d.stmt.scope is self.scopes[0] for d in self._defs[text]):
                return text
        return None

    def _assigned_in_class(self, text: str, class_name: str) -> bool:
        return any(d.stmt.scope.class_name == class_name for d in self._defs.get(text, ()))

    # sites --------------------------------------------------------------------------
    def _scaler_step(self, c) -> bool:
        return c.method == "step" and bool(positional(c.call)) and "scal" in (c.receiver or "")

    def _site(self, c) -> Site | None:
        scope = c.stmt.scope
        method, receiver = c.method, c.receiver
        qual = self.imports.qualify(c.call.func) or ""
        kind = None
        if method == "backward" and not self.imports.is_imported(c.call.func):
            kind = "engine_backward" if self._engine_backward(c, scope) else "backward"
        elif qual == "torch.autograd.backward":
            kind = "backward"
        elif method == "manual_backward" and positional(c.call):
            kind = "engine_backward"  # a LightningModule's backward in manual optimization
        elif method == "step":
            kind = self._step_kind(receiver, scope)
        elif method == "update" and self.scaler_role(receiver, scope):
            kind = "scaler_update"
        elif method == "unscale_" and self.scaler_role(receiver, scope):
            kind = "unscale"
        elif method == "unscale_gradients" and self.engine_for(receiver, scope):
            kind = "unscale"
        elif last_part(qual) in _CLIP_FUNCTIONS and self._is_clip(qual, method, receiver, scope):
            kind = "clip"
        elif method == "zero_grad":
            kind = "zero_grad"
        elif method in ("div_", "mul_") and ".grad" in (receiver or ""):
            kind = "grad_div"
        elif qual in ("torch._foreach_div_", "torch._foreach_mul_"):
            kind = "grad_div"
        if kind is None:
            return None
        return Site(kind, c.call, c.stmt, receiver)

    def _engine_backward(self, c, scope: Scope) -> bool:
        """`engine.backward(loss)`: a known engine, or any receiver handed a loss.

        `Tensor.backward` takes a gradient positionally (`out.backward(torch.ones_like(out))`);
        a positional loss (`fabric.backward(loss)`, a DeepSpeed `model.backward(loss)`) means
        an engine's backward, whose scaling and division the linter cannot see.
        """
        if not c.call.args:
            return False
        if self.engine_for(c.receiver, scope) is not None:
            return True
        args = positional(c.call)
        return bool(args) and "loss" in code(args[0]).lower()

    def divides_by_k(self, site: Site) -> bool:
        """Whether an engine backward divides by the accumulation steps itself (Fabric's does
        not: it scales for precision only, the loop divides)."""
        pair = method_call(site.call) if site.call is not None else None
        if pair is not None and pair[1] == "manual_backward":
            return False  # Lightning leaves accumulation to manual optimization
        engine = self.engine_for(site.receiver, site.stmt.scope)
        return engine is None or engine.kind != "fabric"

    def _step_kind(self, receiver: str | None, scope: Scope) -> str | None:
        if self.scaler_role(receiver, scope):
            return "scaler_step"
        if self.is_scheduler(receiver):
            return "sched_step"
        if self.is_optimizer(receiver):
            return "opt_step"
        return None

    def _is_clip(self, qual: str, method, receiver, scope: Scope) -> bool:
        if method is None:
            return qual.startswith("torch.nn.utils") or "." not in qual
        if qual.startswith("torch.nn.utils"):
            return True
        return self.engine_for(receiver, scope) is not None or "model" in (receiver or "")

    def _grad_divisions(self, scope: Scope) -> list[Site]:
        """`p.grad /= N` / `p.grad *= 1 / N`: gradients divided instead of the loss."""
        found = []
        for name, defs in scope.defs.items():
            if ".grad" in name or name.endswith("grad"):
                for d in defs:
                    if d.op in ("/=", "*=") or (d.op == "=" and "/" in code(d.value)):
                        found.append(Site("grad_div", None, d.stmt, name, d.stmt.node))
        return found

    def _regions(self, scope: Scope) -> list[Region]:
        regions = []
        for with_node, frames in scope.withs:
            for item in with_node.items:
                call = item.item if isinstance(item.item, cst.Call) else self._context(item, scope)
                if call is None:
                    continue
                kind = self._region_kind(call, scope)
                if kind is not None:
                    pair = method_call(call)
                    receiver = dotted(pair[0]) if pair else None
                    via_name = call is not item.item
                    regions.append(Region(kind, with_node, item, call, receiver, frames, via_name))
        return regions

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
            if isinstance(option, cst.Call) and self._region_kind(option, scope) == "autocast":
                return option
        return None

    def _region_kind(self, call: cst.Call, scope: Scope) -> str | None:
        qual = self.imports.qualify(call.func) or ""
        if qual in _AUTOCAST or (qual == "autocast"):
            return "autocast"
        pair = method_call(call)
        if pair is None:
            return None
        receiver, method = dotted(pair[0]), pair[1]
        if method == "no_sync":
            return "no_sync"
        if method in ("accumulate", "autocast") and self.engine_for(receiver, scope):
            return "accumulate" if method == "accumulate" else "engine_autocast"
        return None

    def _accumulate_gate(self, loop: TrainingLoop) -> Gate | None:
        """`with accelerator.accumulate(model):` gates the prepared optimizer's step."""
        for site in loop.sites:
            for region in self.regions_around(site.stmt, "accumulate"):
                return Gate("accumulate", self.engine_k(region.receiver), region.with_node)
        return None

    # questions rules ask ------------------------------------------------------------------
    def memo(self, key: str, build):
        """A fact built once per module on first use: `model.memo("precision", build)` where
        `build(model)` makes it. Topic modules (`linter/model/<topic>.py`) keep their facts here,
        so rules share them without growing this class."""
        facts = self.__dict__.setdefault("_memo", {})
        if key not in facts:
            facts[key] = build(self)
        return facts[key]

    def has_training_loop(self) -> bool:
        return bool(self.loops)

    def loop_sites(self, loop: TrainingLoop, *kinds: str) -> list[Site]:
        return loop.of_kind(*kinds)

    def calls_in_with(self, with_node: cst.With) -> list:
        """The call sites inside a `with` block (built once per module, on first use)."""
        if self._calls_by_with is None:
            self._calls_by_with = {}
            for call in self.calls:
                for frame in call.stmt.frames:
                    if frame.kind == "with":
                        self._calls_by_with.setdefault(id(frame.node), []).append(call)
        return self._calls_by_with.get(id(with_node), [])

    def regions_around(self, stmt: Stmt, kind: str) -> list[Region]:
        frames = {id(f.node) for f in stmt.frames if f.kind == "with"}
        return [r for r in self.regions if r.kind == kind and id(r.with_node) in frames]

    def gate_for(self, loop: TrainingLoop, stmt: Stmt) -> Gate | None:
        """The step gate on the paths through `stmt`.

        A loop may step every batch in one branch and every K batches in another (Swin's
        `if ACCUMULATION_STEPS > 1:` ... `else:`); only the steps that can run in the same
        iteration as `stmt` say whether it is in a manual accumulation window.
        """
        gate = loop.gate
        if gate is None or gate.kind not in ("modulo", "counter"):
            return gate
        steps = [s for s in loop.steps if same_path(s.stmt, stmt)]
        gates = [g for s in steps if (g := step_gate(loop, s)) is not None]
        if steps and not gates:
            return None
        return gates[0] if gates else gate

    def on_update_step(
        self, loop: TrainingLoop, stmt: Stmt, node: cst.CSTNode | None = None
    ) -> bool:
        """Whether the statement (or the expression `node` in it) runs only when the optimizer
        steps."""
        frames = loop.frames_of(stmt)
        accept = partial(self._counts_windows, loop)
        gates = [update_gate(f, loop.counters, loop.flags, accept) for f in frames]
        if node is not None:
            gates.append(inline_gate(stmt, node, loop.counters, loop.flags, accept))
        if any(g is not None for g in gates):
            return True
        gate = loop.gate
        if gate is not None and gate.kind == "micro-loop":
            return not any(f.node is gate.node for f in frames)  # once per outer iteration
        return bool(self._step_only_branches(loop, stmt) & _branches(frames))

    def _counts_windows(self, loop: TrainingLoop, kind: str, k: cst.BaseExpression | None) -> bool:
        """A modulo condition marks update steps only when its modulus is the accumulation value:
        `if step % args.logging_steps == 0:` beside a window of `args.grad_accum` is a logging
        cadence. A modulus is accepted when no K is known, when it names K as the step gate or
        the engine does (`self.update_freq` and `args.update_freq` alike), or when its name says
        it is an accumulation value."""
        if kind != "modulo" or k is None:
            return True
        known = [e for e in (loop.gate.k if loop.gate else None, self.engine_k()) if e is not None]
        if not known or _K_NAME.search(_short_name(k)):
            return True
        return _short_name(k) in {_short_name(e) for e in known}

    def _step_only_branches(self, loop: TrainingLoop, stmt: Stmt) -> set[tuple[int, bool]]:
        """`if` branches that hold a step of this path but no backward: the update branch."""
        steps = {b for s in loop.steps if same_path(s.stmt, stmt) for b in _branches(s.stmt.frames)}
        backwards = {b for s in loop.backwards for b in _branches(s.stmt.frames)}
        return steps - backwards

    def flow(self, site: Site) -> Flow | None:
        """The dataflow of the loss of a backward site."""
        loss = self.loss_expr(site)
        if loss is None:
            return None
        return trace_loss(self, site.stmt.scope, loss, site.stmt)

    def loss_expr(self, site: Site) -> cst.BaseExpression | None:
        call = site.call
        if call is None:
            return None
        if site.kind == "engine_backward" or self.is_backward_function(call):
            args = positional(call)
            return args[0] if args else None
        receiver = call.func.value
        scaled = self.scaled_loss(receiver, site.stmt.scope)
        return scaled if scaled is not None else receiver

    def names_a_sequence(self, expr: cst.BaseExpression, stmt: Stmt) -> bool:
        """A name bound to a list or tuple of losses (`torch.autograd.backward(losses)`): a fix
        that divides it (`losses / K`) or hands it to an engine would not run."""
        if not isinstance(expr, cst.Name):
            return False
        defs = stmt.scope.defs_before(expr.value, stmt.order)
        if not defs or defs[-1].op != "=" or defs[-1].tuple_index is not None:
            return False
        value = defs[-1].value
        if isinstance(value, cst.Call):
            return dotted(value.func) in ("list", "tuple")
        return isinstance(value, (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp))

    def is_backward_function(self, call: cst.Call) -> bool:
        """`torch.autograd.backward(loss)` rather than `loss.backward()`."""
        return self.imports.qualify(call.func) == "torch.autograd.backward"

    def scaled_loss(self, node: cst.CSTNode, scope: Scope) -> cst.BaseExpression | None:
        """`X` in `scaler.scale(X)`."""
        pair = method_call(node)
        if pair is not None and pair[1] == "scale" and positional(node):
            if self.scaler_role(dotted(pair[0]), scope) is not None or "scal" in code(pair[0]):
                return positional(node)[0]
        return None

    def is_scaled_loss(self, node: cst.CSTNode, scope: Scope, order: int) -> bool:
        """Whether the tensor a backward starts from (at statement `order`) went through
        `scaler.scale`: directly, in an arm of `scaler.scale(loss) if amp else loss` (the other
        arm is a deliberate fp32 path), or through a name bound to one."""
        return self._scaled_value(node, scope, order, 0)

    def _names_a_scaled_loss(
        self, node: cst.CSTNode, scope: Scope, order: int, depth: int = 0
    ) -> bool:
        """A name last bound (before statement `order`) to a scaled loss, also after arithmetic:
        `scaled = scaler.scale(loss)`, `scaled = scaled / K` (or `scaled /= K`), then
        `scaled.backward()`."""
        text = dotted(node)
        defs = scope.defs_before(text, order) if text else []
        if not defs or defs[-1].tuple_index is not None or depth > _MAX_RESOLVE_DEPTH:
            return False
        d = defs[-1]
        if d.op != "=":  # `scaled /= K` keeps what `scaled` held
            return self._names_a_scaled_loss(node, scope, d.stmt.order, depth + 1)
        return self._scaled_value(d.value, scope, d.stmt.order, depth + 1)

    def _scaled_value(self, value: cst.CSTNode, scope: Scope, order: int, depth: int) -> bool:
        value = strip_parens(value)
        if self.scaled_loss(value, scope) is not None:
            return True
        if isinstance(value, cst.BinaryOperation):
            sides = (value.left, value.right)
            return any(self._scaled_value(side, scope, order, depth) for side in sides)
        if isinstance(value, cst.IfExp):
            arms = (value.body, value.orelse)
            return any(self._scaled_value(arm, scope, order, depth) for arm in arms)
        return dotted(value) is not None and self._names_a_scaled_loss(value, scope, order, depth)

    def engine_k(self, engine_text: str | None = None) -> cst.BaseExpression | None:
        """The accumulation value given to an engine (the first configured one by default)."""
        engines = [e for e in self.setup.engines.values() if e.accum is not None]
        if engine_text is not None:
            engines = [e for e in engines if e.name == engine_text] or engines
        return engines[0].accum if engines else None

    def line(self, node: cst.CSTNode) -> int:
        return self.positions.line(node)


def _short_name(node: cst.BaseExpression) -> str:
    """`update_freq` for `self.update_freq`; the code of anything that is not a dotted name."""
    text = dotted(node)
    return last_part(text) if text else code(strip_parens(node))


def _branches(frames) -> set[tuple[int, bool]]:
    return {(id(f.node), f.holds) for f in frames if f.kind == "if"}


_MOVES = {"to", "cuda", "cpu", "half", "float", "train", "eval", "requires_grad_"}
_MAX_RESOLVE_DEPTH = 6


def _is_prepare_call(value: cst.Call) -> bool:
    pair = method_call(value)
    return pair is not None and pair[1] in ("prepare", "prepare_model")
