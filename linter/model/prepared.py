"""Prepared objects: whether a name, at a point of a function, holds something that went through
an engine's `prepare(...)`, resolved as Python resolves names (own assignments, then what callers
pass for a parameter, then enclosing scopes)."""

from __future__ import annotations

import libcst as cst

from linter.model.callgraph import CallGraph
from linter.model.cst_util import dotted, method_call
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Def, Scope, Stmt
from linter.model.setup import Setup, is_prepare_call

_MOVES = {"to", "cuda", "cpu", "half", "float", "train", "eval", "requires_grad_"}


class PreparedObjects:
    def __init__(self, setup: Setup, graph: CallGraph) -> None:
        self.setup = setup
        self.graph = graph

    def is_prepared(self, text: str | None, scope: Scope, order: int | None = None) -> bool:
        """Whether a name in `scope` (before statement `order`, when given) holds an object that
        went through `prepare(...)`."""
        if text not in self.setup.prepared:
            return False
        return self._holds(text, scope, order, wrappers=False, depth=0)

    def derives_from_prepared(self, text: str | None, scope: Scope) -> bool:
        """Prepared, or built from a prepared object: `diffusion = MedSegDiff(model).to(dev)`
        runs the prepared `model` inside its own forward."""
        return bool(text) and self._holds(text, scope, None, wrappers=True, depth=0)

    def seen_prepared(self, text: str | None, scope: Scope) -> bool:
        """`derives_from_prepared`, but a parameter whose callers are not all seen (a function
        called from elsewhere) does not count: the value must be seen coming from `prepare`."""
        return bool(text) and self._holds(text, scope, None, wrappers=True, depth=0, unknown=False)

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
        if depth >= FOLLOW_DEPTH:
            return False
        callers = self.graph.callers(scope)
        return any(self.prepared_in_reach(call.stmt.scope, depth + 1) for call in callers)

    def _holds(
        self,
        text: str,
        scope: Scope,
        order: int | None,
        *,
        wrappers: bool,
        depth: int,
        unknown: bool = True,
    ) -> bool:
        """Resolve a name as Python does: the assignments of its own function (those before
        `order`), else the arguments its callers pass for a parameter, else the enclosing
        function or the module. `unknown` answers for a name whose value cannot be seen (a
        parameter of a function called from elsewhere)."""
        if depth > FOLLOW_DEPTH:
            return unknown and text in self.setup.prepared
        defs = self._visible_defs(text, scope, order)
        if defs:
            return any(self._def_holds(d, wrappers, depth, unknown) for d in defs)
        if "." in text:
            return False
        if text in scope.params:
            sites = self.graph.argument_sites(scope, text)
            if not sites:  # a function that prepares its own objects left this one alone
                return unknown and not self._prepares_in(scope)
            return any(self._argument_holds(e, s, wrappers, depth + 1, unknown) for e, s in sites)
        if scope.parent is not None:
            return self._holds(
                text, scope.parent, None, wrappers=wrappers, depth=depth, unknown=unknown
            )
        return unknown and text in self.setup.prepared

    def _prepares_in(self, scope: Scope) -> bool:
        """Whether `scope` itself assigns the result of a `prepare(...)` call."""
        return any(d.stmt.scope is scope for d in self.setup.prepared_defs)

    def _visible_defs(self, text: str, scope: Scope, order: int | None) -> list[Def]:
        """The assignments that may bind `text` at this point of `scope`: the last one before
        `order`, or all of them (a loop may carry any of them around)."""
        if "." in text:
            local = scope.defs.get(text)
            return local if local else self.graph.module_defs(text)
        defs = list(scope.defs.get(text, ()))
        if scope.parent is None:
            defs += [
                d for s in self.graph.scopes if text in s.globals for d in s.defs.get(text, ())
            ]
        if order is not None:
            before = [d for d in defs if d.stmt.order < order]
            if before:
                return before[-1:]
            if text in scope.params:
                return []
        return defs

    def _def_holds(self, d: Def, wrappers: bool, depth: int, unknown: bool) -> bool:
        if d in self.setup.prepared_defs:
            return True
        if not wrappers or d.op != "=":
            return False
        return self._value_holds(d.value, d.stmt.scope, d.stmt.order, depth + 1, unknown)

    def _value_holds(self, value, scope: Scope, order: int, depth: int, unknown: bool) -> bool:
        """`model.to(dev)` of a prepared model, or `Wrapper(model, ...)` built from one (the
        arguments of a constructor count only when visibly prepared)."""
        text = dotted(value)
        if text is not None:
            return self._holds(text, scope, order, wrappers=True, depth=depth, unknown=unknown)
        if not isinstance(value, cst.Call) or depth > FOLLOW_DEPTH:
            return False
        if is_prepare_call(value):
            return True
        pair = method_call(value)
        if pair is not None and pair[1] in _MOVES:
            return self._value_holds(pair[0], scope, order, depth + 1, unknown)
        return any(self._value_holds(a.value, scope, order, depth + 1, False) for a in value.args)

    def _argument_holds(self, expr, stmt: Stmt, wrappers: bool, depth: int, unknown: bool) -> bool:
        text = dotted(expr)
        if text is not None:
            return self._holds(
                text, stmt.scope, stmt.order, wrappers=wrappers, depth=depth, unknown=unknown
            )
        if not isinstance(expr, cst.Call):
            return unknown
        if wrappers:
            return self._value_holds(expr, stmt.scope, stmt.order, depth, unknown)
        return is_prepare_call(expr)
