"""What a value evaluates to, followed through the module's own helpers: the one resolver for
"which construction does this name hold" (`scaler = get_grad_scaler()`, `model = wrap(model)`)
and its inverse, "which names receive what this helper returns" (`loader = build_loader(ds)`).

A reviewer reads `scaler = make_scaler(args)` by looking at `make_scaler`: its `return
GradScaler(...)` (or `scaler = GradScaler(...); return scaler`) makes the caller's name a
scaler. Only the module's own functions are followed (the call graph's `local_function`),
`FOLLOW_DEPTH` hops at most, so a recursive helper ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from linter.model.callgraph import CallGraph
from linter.model.cst_util import dotted
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import CallSite, Scope


def constructions(
    graph: CallGraph,
    value: cst.BaseExpression | None,
    scope: Scope,
    depth: int = 0,
    helpers: bool = True,
) -> Iterator[cst.Call]:
    """The calls `value` may evaluate to, in source order: the call itself, both arms of a
    conditional (`X(...) if c else None`), and (unless `helpers` is False) what a module
    function it calls returns."""
    if depth > FOLLOW_DEPTH or value is None:
        return
    if isinstance(value, cst.IfExp):
        yield from constructions(graph, value.body, scope, depth, helpers)
        yield from constructions(graph, value.orelse, scope, depth, helpers)
        return
    if not isinstance(value, cst.Call):
        return
    yield value
    helper = graph.local_function(value.func, scope) if helpers else None
    if helper is not None:
        yield from _returned(graph, helper, depth + 1)


def _returned(graph: CallGraph, helper: Scope, depth: int) -> Iterator[cst.Call]:
    """The calls a helper's return statements evaluate to (a returned name: its assignments
    before the return)."""
    for returned, stmt in helper.returns:
        yield from constructions(graph, returned, helper, depth)
        text = dotted(returned)
        if text is None:
            continue
        for d in helper.defs_before(text, stmt.order + 1):
            if d.op == "=" and d.tuple_index is None:
                yield from constructions(graph, d.value, helper, depth)


def receiving_calls(graph: CallGraph, site: CallSite) -> list[CallSite]:
    """The module's calls of the function that returns `site`'s call (`return DataLoader(...)`,
    or `loader = DataLoader(...); return loader`): each of them evaluates to it. Empty when the
    call is not returned."""
    scope = site.stmt.scope
    if not any(_returns_call(value, site, scope) for value, _ in scope.returns):
        return []
    return graph.callers(scope)


def _returns_call(value: cst.BaseExpression, site: CallSite, scope: Scope) -> bool:
    if value is site.call:
        return True
    text = dotted(value)
    node = site.stmt.node
    if text is None or not isinstance(node, cst.Assign) or len(node.targets) != 1:
        return False
    return node.value is site.call and dotted(node.targets[0].target) == text
