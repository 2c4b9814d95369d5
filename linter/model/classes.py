"""Classes of the module: what their methods bind on `self` and what each method and context
manager does to the training step.

A trainer keeps its objects on `self` (`self.scaler = GradScaler()` in `__init__`, a window
counter `self.micro_step` bumped in `train_step` and reset in `optimizer_step`): an attribute any
method assigns is a binding of the class, known in every method. The summaries are plain data
(`MethodSummary`, `ContextSummary`) so that a caller, in this module or another one, asks "what
does `Trainer.optimizer_step` do" rather than re-walking its body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import dotted, method_call, positional
from linter.model.depths import METHOD_CALL_DEPTH
from linter.model.functions import CallSite, Def, Frame, Scope, Stmt
from linter.model.kinds import ContextKind, FrameKind, RegionKind, SiteKind
from linter.model.loops import Site

if TYPE_CHECKING:
    from linter.model import Model


@dataclass(eq=False)
class ClassFacts:
    """One class: its methods by name and the `self.<attr>` bindings each method makes."""

    name: str
    methods: dict[str, Scope] = field(default_factory=dict)
    attributes: dict[str, list[Def]] = field(default_factory=dict)  # "self.scaler" -> defs

    def defs(self, text: str, outside: Scope | None = None) -> list[Def]:
        """The assignments to `self.<attr>` in the class's methods (but `outside`)."""
        return [d for d in self.attributes.get(text, ()) if d.stmt.scope is not outside]


class Classes:
    """The module's classes, indexed once from the scopes the collector made."""

    def __init__(self, scopes: list[Scope]) -> None:
        self.by_name: dict[str, ClassFacts] = {}
        for scope in scopes:
            if scope.class_name is None or not isinstance(scope.node, cst.FunctionDef):
                continue
            facts = self.by_name.setdefault(scope.class_name, ClassFacts(scope.class_name))
            facts.methods.setdefault(scope.name, scope)
            receiver = _receiver(scope)
            for text, defs in scope.defs.items() if receiver == "self" else ():
                if text.startswith("self.") and text.count(".") == 1:
                    facts.attributes.setdefault(text, []).extend(defs)

    def of(self, scope: Scope) -> ClassFacts | None:
        return self.by_name.get(scope.class_name) if scope.class_name else None

    def attribute_defs(self, scope: Scope, text: str) -> list[Def]:
        """What the other methods of `scope`'s class assign to `text` (`self.micro_step`)."""
        facts = self.of(scope)
        if facts is None or not text.startswith("self."):
            return []
        return facts.defs(text, outside=scope)


def _receiver(scope: Scope) -> str | None:
    names = list(scope.params)
    return names[0] if names and scope.class_name is not None else None


# what a method does ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MethodSummary:
    """What running a function does to the step, its own code and the module functions it
    calls together: the site kinds it reaches (`backward`, `scaler_step`, `unscale`, `clip`,
    `scaler_update`, `opt_step`, `zero_grad`, `sched_step`...) and the functions that reach
    them."""

    name: str
    does: frozenset[SiteKind]
    through: tuple[str, ...]  # the module functions called on the way, in order

    def scales_and_steps(self) -> bool:
        return {SiteKind.SCALER_STEP, SiteKind.SCALER_UPDATE} <= self.does


def summarize(model: Model, scope: Scope, depth: int = 3) -> MethodSummary:
    """The summary of one function or method (callees followed `depth` calls deep)."""
    does: set[SiteKind] = set()
    through: list[str] = []
    seen = {id(scope)}
    frontier = [scope]
    for _ in range(depth + 1):
        following = []
        for current in frontier:
            does.update(site.kind for site in model.sites.get(id(current), ()))
            for call in current.calls:
                callee = model.local_function(call.call.func, current)
                if callee is not None and id(callee) not in seen:
                    seen.add(id(callee))
                    through.append(_qualified(callee))
                    following.append(callee)
        frontier = following
    return MethodSummary(_qualified(scope), frozenset(does), tuple(through))


def _qualified(scope: Scope) -> str:
    return f"{scope.class_name}.{scope.name}" if scope.class_name else scope.name


# what a context manager enters --------------------------------------------------------------------
_CONTEXT_DECORATORS = {"contextlib.contextmanager", "contextmanager"}


@dataclass(frozen=True)
class Entered:
    """One context a context manager enters: its kind, the call that enters it, and whether it
    is entered on some paths only (`if sync: yield`)."""

    kind: ContextKind
    call: cst.Call
    conditional: bool


@dataclass(frozen=True)
class ContextSummary:
    name: str
    enters: tuple[Entered, ...]

    def kinds(self) -> set[ContextKind]:
        return {e.kind for e in self.enters}


def context_summary(model: Model, name: str) -> ContextSummary | None:
    """What the module's context manager `name` enters: a `@contextmanager` function (what it
    yields inside), or a class (what its `__enter__` enters or calls `__enter__` on)."""
    bodies = _context_bodies(model, name)
    if bodies is None:
        return None
    enters = []
    for body in bodies:
        calls = [(c.call, c.stmt.frames) for c in body.calls]
        calls += [
            (i.item, frames) for w, frames in body.withs for i in w.items
        ]  # `with m.no_sync():`
        for call, frames in calls:
            kind = _context_kind(model, call, body) if isinstance(call, cst.Call) else None
            if kind is not None:
                conditional = any(f.kind in (FrameKind.IF, FrameKind.EXIT) for f in frames)
                enters.append(Entered(kind, call, conditional))
    return ContextSummary(name, tuple(enters))


def _context_bodies(model: Model, name: str) -> list[Scope] | None:
    functions = [s for s in model.function_defs.get(name, ()) if s.class_name is None]
    if len(functions) == 1:
        decorators = functions[0].node.decorators
        qualified = {model.imports.qualify(_decorator(d)) for d in decorators}
        return functions if qualified & _CONTEXT_DECORATORS else None
    if name not in model.class_names:
        return None
    enter = [s for s in model.function_defs.get("__enter__", ()) if s.class_name == name]
    init = [s for s in model.function_defs.get("__init__", ()) if s.class_name == name]
    return enter + init if enter else None


def _decorator(decorator: cst.Decorator) -> cst.BaseExpression:
    node = decorator.decorator
    return node.func if isinstance(node, cst.Call) else node


_CONTEXT_FUNCTIONS = {
    "torch.no_grad": ContextKind.NO_GRAD,
    "torch.inference_mode": ContextKind.NO_GRAD,
    "torch.enable_grad": ContextKind.ENABLE_GRAD,
}


def _context_kind(model: Model, call: cst.Call, scope: Scope) -> ContextKind | None:
    """The kind of context `call` makes, as the regions of the loop model name them."""
    from linter.model.sites import AUTOCAST

    qualified = model.imports.qualify(call.func) or ""
    if qualified in AUTOCAST:
        return ContextKind.AUTOCAST
    if qualified in _CONTEXT_FUNCTIONS:
        return _CONTEXT_FUNCTIONS[qualified]
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "no_sync":
        return ContextKind.NO_SYNC
    if isinstance(func, cst.Attribute) and func.attr.value == "autocast":
        engine = model.engine_for(dotted(func.value), scope)
        return ContextKind.ENGINE_AUTOCAST if engine else None
    return None


def entered_region(model: Model, call: cst.Call) -> tuple[RegionKind, cst.Call] | None:
    """(region kind, the call that makes it) for a `with` item calling one of the module's
    context managers that always enters autocast or `no_grad` (`with MixedPrecision():`); one
    entered on some paths only is left unknown."""
    name = dotted(call.func)
    summary = context_summary(model, name) if name and "." not in name else None
    if summary is None:
        return None
    for entered in summary.enters:
        if entered.kind == ContextKind.AUTOCAST and not entered.conditional:
            return RegionKind.AUTOCAST, entered.call
    return None


# a step split over methods ------------------------------------------------------------------
# What a trainer's `optimizer_step()` / `_average_gradients()` does to the update step: these run,
# for the loop model, where `train_step` calls them. A backward stays in its own method, which
# runs every batch with its caller's gate (`Gates._caller_gate`).
STEP_KINDS_AT_CALL = {
    SiteKind.UNSCALE,
    SiteKind.CLIP,
    SiteKind.SCALER_STEP,
    SiteKind.SCALER_UPDATE,
    SiteKind.OPT_STEP,
    SiteKind.ZERO_GRAD,
    SiteKind.SCHED_STEP,
    SiteKind.GRAD_DIV,
}


def inline_method_sites(graph, sites: dict[int, list[Site]]) -> None:
    """Add to each method's sites the update-step sites of the methods of its class it calls
    (`self.optimizer_step()`), as statements at the call: on its path, under its gate."""
    added: dict[int, list[Site]] = {}
    for scope in graph.scopes:
        if scope.class_name is None:
            continue
        found = _called_sites(graph, sites, scope, None, 0, {id(scope)})
        if found:
            added[id(scope)] = found
    for key, found in added.items():
        sites[key] = sorted(sites[key] + found, key=lambda s: s.stmt.order)


def inlined_callee(graph, call) -> Scope | None:
    """The method of the caller's class whose update-step sites `call` (`self.optimizer_step()`)
    brings into the caller: those sites are the caller's, at the call."""
    text = call.func or ""
    scope = call.stmt.scope
    if scope.class_name is None or not text.startswith("self.") or text.count(".") != 1:
        return None
    callee = graph.local_function(call.call.func, scope)
    if callee is None or callee is scope or callee.class_name != scope.class_name:
        return None
    return callee


def _called_sites(graph, sites, scope: Scope, via: Stmt | None, depth: int, seen: set[int]):
    found = []
    for call in scope.calls:
        callee = inlined_callee(graph, call)
        if callee is None or id(callee) in seen:
            continue
        own = sites.get(id(callee), ())
        if any(site.kind in (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD) for site in own):
            continue  # a whole step of its own (YOLOX's `train_one_iter`), judged as such
        at = via if via is not None else call.stmt
        for site in own:
            if site.kind in STEP_KINDS_AT_CALL and site.stmt.via is None:
                found.append(_seen_at(site, at))
        if depth + 1 < METHOD_CALL_DEPTH:
            found += _called_sites(graph, sites, callee, at, depth + 1, seen | {id(callee)})
    return found


def _seen_at(site: Site, call: Stmt, frames: tuple[Frame, ...] | None = None) -> Site:
    """The method's site as a statement of the caller, at the call (in the method's order);
    `frames`: the method's frames as the call sees them, when not its own."""
    own = site.stmt
    stmt = Stmt(
        own.node,
        own.line,
        own.index,
        call.frames + (own.frames if frames is None else frames),
        call.order + own.order / 1e6,
        call.scope,
        own.comprehensions,
        via=call,
    )
    return Site(site.kind, site.call, stmt, site.receiver, site.node)


# an instance of a module class called ---------------------------------------------------------
# A loss scaler (MAE's `NativeScalerWithGradNormCount`) is called, not stepped: `loss_scaler(loss,
# optimizer, clip_grad=..., parameters=..., update_grad=(i + 1) % K == 0)` runs its `__call__`,
# which scales the loss, backpropagates, and on the update step unscales, clips, steps and
# updates. For the loop model the call is that backward, and the update step at the call: its
# `if update_grad:` is the condition the caller passes.
_INSTANCE_DEPTH = 3  # callers followed to find what an instance parameter was built as
# What the call stands for in the caller's loop: its backward and its (gated) update step. The
# clip and the unscale stay the class's own, judged in `__call__` itself (`scaler_protocol`'s
# wrapper bodies): seen at the call too, each finding in them would be said twice.
_INSTANCE_STEP_KINDS = {SiteKind.SCALER_STEP, SiteKind.SCALER_UPDATE, SiteKind.OPT_STEP}


@dataclass(frozen=True)
class InstanceCall:
    """A call of an instance of a module class: `call` runs `method` (its `__call__`) with
    `bindings` (each parameter's argument, else its default)."""

    call: CallSite
    method: Scope
    instance: str  # the caller's name for the instance (`loss_scaler`, `self.loss_scaler`)
    bindings: dict[str, cst.BaseExpression]


def instance_calls(graph) -> list[InstanceCall]:
    """The module's calls of instances of its own classes that define `__call__`."""
    methods = {s.class_name: s for s in graph.function_defs.get("__call__", ()) if s.class_name}
    found = []
    for call in graph.calls if methods else ():
        text = dotted(call.call.func)
        if text is None or not _names_an_instance(text) or text in graph.function_defs:
            continue
        classes = _classes_of(graph, methods, text, call.stmt.scope, _INSTANCE_DEPTH)
        if len(classes) == 1 and None not in classes:
            method = methods[next(iter(classes))]
            bindings = _bindings(method, call.call)
            if bindings is not None:
                found.append(InstanceCall(call, method, text, bindings))
    return found


def _names_an_instance(text: str) -> bool:
    return "." not in text or (text.startswith("self.") and text.count(".") == 1)


def _classes_of(graph, methods, text: str, scope: Scope, depth: int) -> set[str | None]:
    """The classes `text` is an instance of where `scope` reads it (None: something else, or
    unknown): its assignments there, in the class's methods for `self.x`, at module level, or
    what the callers pass when it is a parameter."""
    if text.startswith("self."):
        defs = [d for d in graph.module_defs(text) if d.stmt.scope.class_name == scope.class_name]
    else:
        defs = scope.defs.get(text) or (
            [] if text in scope.params else graph.scopes[0].defs.get(text, [])
        )
    found: set[str | None] = set()
    for d in defs:
        value = d.value if d.op == "=" and d.tuple_index is None else None
        if isinstance(value, cst.Name) and value.value == "None":
            continue  # no scaler on that path (BEiT's DeepSpeed branch): it is never called
        name = dotted(value.func) if isinstance(value, cst.Call) else None
        found.add(name if name in methods else None)
    if not defs and text not in scope.params and scope.parent is not None:
        return _classes_of(graph, methods, text, scope.parent, depth)  # read from a closure
    if not defs and text in scope.params and depth > 0:
        for expr, stmt in graph.argument_sites(scope, text):
            passed = dotted(expr)
            if passed is None:
                found.add(None)
            else:
                found |= _classes_of(graph, methods, passed, stmt.scope, depth - 1)
    return found or {None}


def _bindings(method: Scope, call: cst.Call) -> dict[str, cst.BaseExpression] | None:
    """Each parameter of `method` but `self`: what `call` passes, else its default (None when
    the call unpacks `*args`/`**kwargs`, so what goes where is unknown)."""
    if any(a.star for a in call.args):
        return None
    names = list(method.params)[1:]
    bound: dict[str, cst.BaseExpression] = {}
    positional_args = [a.value for a in call.args if a.keyword is None]
    for name, value in zip(names, positional_args, strict=False):  # extra ones: `*args`
        bound[name] = value
    for arg in call.args:
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg.value
    for name in names:
        default = method.params[name].default
        if name not in bound and default is not None:
            bound[name] = default
    return bound


def inline_instance_calls(graph, sites: dict[int, list[Site]]) -> list[InstanceCall]:
    """Add to each caller's sites what its loss scaler's call does: a backward of the loss it
    passes, at the call, and the `__call__`'s update-step sites seen at the call, under the
    conditions the call passes."""
    found = []
    for instance in instance_calls(graph):
        own = sites.get(id(instance.method), ())
        backward = _scaled_loss_param(instance, own)
        if backward is None:
            continue  # a callable that does not backpropagate what it is handed stays opaque
        loss, scaler = backward
        call = instance.call
        added = [Site(SiteKind.BACKWARD, call.call, call.stmt, loss=loss, scaler=scaler)]
        for site in own:
            if site.kind in _INSTANCE_STEP_KINDS and site.stmt.via is None:
                added.append(_called_with(site, instance))
        key = id(call.stmt.scope)
        sites[key] = sorted(sites[key] + added, key=lambda s: s.stmt.order)
        found.append(instance)
    return found


def _scaled_loss_param(instance: InstanceCall, own: list[Site]) -> tuple | None:
    """(the argument passed as the loss, the scaler in the caller's words) when `__call__`
    backpropagates `self.<scaler>.scale(<parameter>)`."""
    for site in own:
        if site.kind != SiteKind.BACKWARD or site.call is None:
            continue
        func = site.call.func
        scaled = func.value if isinstance(func, cst.Attribute) else None
        pair = method_call(scaled) if scaled is not None else None
        if pair is None or pair[1] != "scale" or not positional(scaled):
            return None
        loss = dotted(positional(scaled)[0])
        receiver = dotted(pair[0]) or ""
        if loss not in instance.bindings or not receiver.startswith("self."):
            return None
        scaler = instance.instance + receiver[len("self") :]
        return instance.bindings[loss], scaler
    return None


def edits_a_called_class(model: Model, at: int, lines: list[int]) -> bool:
    """Whether a fix of a finding on line `at` edits `lines` inside the `__call__` of a class
    whose instance the module calls, from outside it: the finding is the caller's (its
    zero_grad, seen against the class's step), and the class is every caller's."""
    for instance in model.instance_calls:
        found = model.positions.range(instance.method.node)
        inside = range(found.start.line, found.end.line + 1)
        if at not in inside and any(line in inside for line in lines):
            return True
    return False


def _called_with(site: Site, instance: InstanceCall) -> Site:
    """A site of `__call__` seen at the call: its `if update_grad:` tests what the call passes
    for `update_grad`, and `self._scaler` is the instance's."""
    frames = tuple(_bound_frame(f, instance.bindings) for f in site.stmt.frames)
    seen = _seen_at(site, instance.call.stmt, frames)
    receiver = site.receiver
    if receiver is not None and receiver.startswith("self."):
        seen.receiver = instance.instance + receiver[len("self") :]
    return seen


def _bound_frame(frame: Frame, bindings: dict[str, cst.BaseExpression]) -> Frame:
    """`if update_grad:` / `if not update_grad:` with the parameter's argument as its test."""
    test = frame.test
    negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    name = dotted(test.expression if negated else test) if test is not None else None
    if frame.kind not in (FrameKind.IF, FrameKind.EXIT) or name not in bindings:
        return frame
    holds = frame.holds != negated
    return Frame(frame.kind, frame.node, holds, condition=bindings[name])
