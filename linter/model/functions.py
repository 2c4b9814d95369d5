"""Scopes (the module body and every function) and what their statements are.

One walk over the statements records, for every small statement, the chain of enclosing loops,
`if` branches, early exits (`if cond: continue`) and `with` blocks inside its function. Everything
else in the model is a question asked of these records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from linter.model.cst_util import dotted, method_call, walk
from linter.model.kinds import FrameKind


@dataclass(frozen=True)
class Frame:
    """One enclosing construct: a loop, an `if` branch, an early exit, or a `with` block.

    For "if" and "exit" frames `holds` says whether `test` is true at the statement: the body of
    an `if` holds, its `else` does not, and after `if test: continue` the test does not hold.
    """

    kind: FrameKind
    node: cst.CSTNode
    holds: bool = True
    # what the test is at a call of the function it is in: `update_grad=(i + 1) % K == 0`
    # passed to a loss scaler's `__call__` for its `if update_grad:`
    condition: cst.BaseExpression | None = None

    @property
    def test(self) -> cst.BaseExpression | None:
        if self.condition is not None:
            return self.condition
        return self.node.test if isinstance(self.node, (cst.If, cst.While)) else None


@dataclass(eq=False)
class Stmt:
    """A small statement and its place: the line holding it and the frames around it."""

    node: cst.BaseSmallStatement
    line: cst.SimpleStatementLine | cst.SimpleStatementSuite
    index: int
    frames: tuple[Frame, ...]
    order: int
    scope: Scope
    # the `for` clauses of comprehensions in it, found by the collector's one walk
    comprehensions: list[cst.CompFor] = field(default_factory=list)
    # a statement of a method, seen where a method of its class calls it (`self.optimizer_step()`
    # in `train_step`): this is that call; `node` and `line` are still the method's
    via: Stmt | None = None

    def loops(self) -> list[cst.CSTNode]:
        return [f.node for f in self.frames if f.kind == FrameKind.LOOP]

    def frames_inside(self, loop: cst.CSTNode) -> tuple[Frame, ...]:
        """The frames nested inside `loop` (all frames when the loop is not among them)."""
        for i, frame in enumerate(self.frames):
            if frame.node is loop:
                return self.frames[i + 1 :]
        return self.frames


@dataclass(eq=False)
class Def:
    """An assignment to a name: `target = value`, `target op= value`, or one tuple element."""

    target: str
    value: cst.BaseExpression | None
    op: str  # "=", "/=", "*=", "+=", ...
    stmt: Stmt
    tuple_index: int | None = None


@dataclass(eq=False)
class CallSite:
    call: cst.Call
    stmt: Stmt
    receiver: str | None  # text of `recv` in `recv.method(...)`
    method: str | None
    func: str | None  # dotted text of the callee


@dataclass(eq=False)
class Scope:
    node: cst.Module | cst.FunctionDef
    name: str
    class_name: str | None
    params: dict[str, cst.Param] = field(default_factory=dict)
    stmts: list[Stmt] = field(default_factory=list)
    defs: dict[str, list[Def]] = field(default_factory=dict)
    calls: list[CallSite] = field(default_factory=list)
    loops: list[cst.CSTNode] = field(default_factory=list)
    withs: list[tuple[cst.With, tuple[Frame, ...]]] = field(default_factory=list)
    returns: list[tuple[cst.BaseExpression, Stmt]] = field(default_factory=list)
    header_reads: set[str] = field(default_factory=set)
    parent: Scope | None = None  # the scope the `def` statement is in (None for the module)
    globals: set[str] = field(default_factory=set)  # names declared `global` here
    _by_order: dict[int, Stmt] | None = field(default=None, init=False, repr=False)

    def statement_at(self, order: int) -> Stmt | None:
        """The statement of this scope with that `order`, through a table built on first use
        (kept on the scope: a table beside it, keyed by the scope, would keep every module's
        tree alive, its statements pointing back at their scope)."""
        if self._by_order is None:
            self._by_order = {s.order: s for s in self.stmts}
        return self._by_order.get(order)

    def reads_elsewhere(self, name: str, stmt: Stmt) -> bool:
        """Whether `name` occurs in this scope outside the statement `stmt`."""
        if name in self.header_reads:
            return True
        for other in self.stmts:
            if other is not stmt:
                if any(isinstance(n, cst.Name) and n.value == name for n in walk(other.node)):
                    return True
        return False

    def defs_before(self, name: str, order: int) -> list[Def]:
        return [d for d in self.defs.get(name, ()) if d.stmt.order < order]


_EXITS = (cst.Continue, cst.Return, cst.Break)


def _is_early_exit(node: cst.CSTNode) -> bool:
    """`if cond: continue` (or return/break) without an else."""
    if not isinstance(node, cst.If) or node.orelse is not None:
        return False
    body = node.body
    statements = body.body
    if isinstance(body, cst.IndentedBlock):
        if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
            return False
        statements = statements[0].body
    return bool(statements) and isinstance(statements[-1], _EXITS)


class ScopeCollector:
    """Walks statements once and fills a `Scope` per function (plus one for the module)."""

    def __init__(self, module: cst.Module) -> None:
        self.scopes: list[Scope] = []
        self.imports: list[cst.Import | cst.ImportFrom] = []
        self.function_defs: dict[str, list[Scope]] = {}
        self.class_names: set[str] = set()  # every class the module defines, at any depth
        self._order = 0
        top = Scope(node=module, name="<module>", class_name=None)
        self.scopes.append(top)
        self._block(module.body, top, ())

    # statements -------------------------------------------------------------
    def _block(self, statements, scope: Scope, frames: tuple[Frame, ...]) -> None:
        for node in statements:
            self._statement(node, scope, frames)
            if _is_early_exit(node):
                frames = frames + (Frame(FrameKind.EXIT, node, holds=False),)

    def _suite(self, suite: cst.BaseSuite, scope: Scope, frames: tuple[Frame, ...]) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self._block(suite.body, scope, frames)
        else:
            self._line(suite, scope, frames)

    def _statement(self, node, scope: Scope, frames: tuple[Frame, ...]) -> None:
        if isinstance(node, cst.SimpleStatementLine):
            self._line(node, scope, frames)
        elif isinstance(node, cst.FunctionDef):
            self._function(node, scope)
        elif isinstance(node, cst.ClassDef):
            self._suite_of_class(node, scope)
        elif isinstance(node, (cst.For, cst.While)):
            scope.loops.append(node)
            self._header_reads(node.iter if isinstance(node, cst.For) else node.test, scope)
            if isinstance(node, cst.For):
                self._add_def_targets(node.target, None, "for", node, scope, frames)
            inner = frames + (Frame(FrameKind.LOOP, node),)
            self._suite(node.body, scope, inner)
            if node.orelse is not None:
                self._suite(node.orelse.body, scope, frames)
        elif isinstance(node, cst.If):
            self._header_reads(node.test, scope)
            self._suite(node.body, scope, frames + (Frame(FrameKind.IF, node, True),))
            if isinstance(node.orelse, cst.If):
                self._statement(node.orelse, scope, frames + (Frame(FrameKind.IF, node, False),))
            elif node.orelse is not None:
                self._suite(node.orelse.body, scope, frames + (Frame(FrameKind.IF, node, False),))
        elif isinstance(node, cst.With):
            inner = frames + (Frame(FrameKind.WITH, node),)
            scope.withs.append((node, inner))
            for item in node.items:
                self._header_reads(item.item, scope)
            self._suite(node.body, scope, inner)
        elif isinstance(node, (cst.Try, cst.TryStar)):
            self._suite(node.body, scope, frames)
            for handler in node.handlers:
                self._suite(handler.body, scope, frames)
            if node.orelse is not None:
                self._suite(node.orelse.body, scope, frames)
            if node.finalbody is not None:
                self._suite(node.finalbody.body, scope, frames)
        elif isinstance(node, cst.Match):
            for case in node.cases:
                self._suite(case.body, scope, frames)

    def _suite_of_class(self, node: cst.ClassDef, scope: Scope) -> None:
        self.class_names.add(node.name.value)
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
        for item in body:
            if isinstance(item, cst.FunctionDef):
                self._function(item, scope, class_name=node.name.value)
            elif isinstance(item, cst.ClassDef):
                self._suite_of_class(item, scope)

    def _function(self, node: cst.FunctionDef, parent: Scope, class_name: str | None = None):
        scope = Scope(node=node, name=node.name.value, class_name=class_name, parent=parent)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            scope.params[param.name.value] = param
        self.scopes.append(scope)
        self.function_defs.setdefault(scope.name, []).append(scope)
        self._block(node.body.body if isinstance(node.body, cst.IndentedBlock) else [], scope, ())
        if not isinstance(node.body, cst.IndentedBlock):
            self._line(node.body, scope, ())

    # small statements ---------------------------------------------------------
    def _line(self, line, scope: Scope, frames: tuple[Frame, ...]) -> None:
        for index, small in enumerate(line.body):
            self._order += 1
            stmt = Stmt(small, line, index, frames, self._order, scope)
            scope.stmts.append(stmt)
            self._small(small, stmt, scope, frames)

    def _small(self, node, stmt: Stmt, scope: Scope, frames) -> None:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            self.imports.append(node)
            return
        if isinstance(node, cst.Assign):
            for target in node.targets:
                self._add_def_targets(target.target, node.value, "=", stmt, scope, frames)
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            self._add_def_targets(node.target, node.value, "=", stmt, scope, frames)
        elif isinstance(node, cst.AugAssign):
            op = type(node.operator).__name__
            self._add_def(dotted(node.target), node.value, _AUG_OPS.get(op, op), stmt, scope)
        elif isinstance(node, cst.Return) and node.value is not None:
            scope.returns.append((node.value, stmt))
        elif isinstance(node, cst.Global):
            scope.globals.update(item.name.value for item in node.names)
        for sub in walk(node):
            if type(sub) is cst.Call:
                pair = method_call(sub)
                receiver = dotted(pair[0]) if pair else None
                if pair and receiver is None and pair[1] in _TEXT_RECEIVERS:
                    receiver = _EMPTY.code_for_node(pair[0])
                scope.calls.append(
                    CallSite(sub, stmt, receiver, pair[1] if pair else None, dotted(sub.func))
                )
            elif type(sub) is cst.CompFor:
                stmt.comprehensions.append(sub)

    def _header_reads(self, expr: cst.CSTNode, scope: Scope) -> None:
        for sub in walk(expr):
            if isinstance(sub, cst.Name):
                scope.header_reads.add(sub.value)

    def _add_def_targets(self, target, value, op, stmt_or_node, scope, frames) -> None:
        if not isinstance(stmt_or_node, Stmt):
            return  # loop targets: only their names matter, as reads elsewhere
        if isinstance(target, (cst.Tuple, cst.List)):
            for i, element in enumerate(target.elements):
                text = dotted(element.value)
                if text is not None:
                    d = Def(text, value, op, stmt_or_node, tuple_index=i)
                    scope.defs.setdefault(text, []).append(d)
            return
        self._add_def(dotted(target), value, op, stmt_or_node, scope)

    def _add_def(self, text, value, op, stmt: Stmt, scope: Scope) -> None:
        if text is not None:
            scope.defs.setdefault(text, []).append(Def(text, value, op, stmt))


_EMPTY = cst.Module(body=[])
# Methods whose receiver the model reads even when it is not a plain dotted name.
_TEXT_RECEIVERS = {"backward", "step", "update", "unscale_", "zero_grad", "div_", "mul_"}
_AUG_OPS = {
    "DivideAssign": "/=",
    "FloorDivideAssign": "//=",
    "MultiplyAssign": "*=",
    "AddAssign": "+=",
    "SubtractAssign": "-=",
}


def bound_arguments(scope: Scope, param: str, calls: list[CallSite]) -> list[cst.BaseExpression]:
    """The expressions passed for `param` at this module's call sites of `scope`'s function."""
    if not isinstance(scope.node, cst.FunctionDef) or param not in scope.params:
        return []
    names = list(scope.params)
    if scope.class_name is not None and names and names[0] in ("self", "cls"):
        names = names[1:]
    position = names.index(param) if param in names else -1
    found = []
    for site in calls:
        callee = site.func or ""
        if callee.rsplit(".", 1)[-1] != scope.name:
            continue
        positional_args = [a.value for a in site.call.args if a.keyword is None and not a.star]
        by_keyword = [a.value for a in site.call.args if a.keyword and a.keyword.value == param]
        if by_keyword:
            found.append(by_keyword[0])
        elif 0 <= position < len(positional_args):
            found.append(positional_args[position])
    return found
