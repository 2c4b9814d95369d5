"""The dataflow of a loss into its backward: was it divided on the way, and by what?

The answer is three-valued on purpose. "divided" means some division (by K, a token count, an item
count) is visible; "undivided" means no path divides, whether it ends in a model or loss-function
output or in a call the linter cannot see into (named in `Flow.opaque`, so that no fix is offered);
"unknown" is left for what could still divide: a same-module function whose body cannot be
resolved, a name with no visible value, or an opaque call (or factor) handed the accumulation value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import code, dotted, int_value, method_call, positional
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Def, Scope, Stmt
from linter.model.kinds import FlowState, FrameKind
from linter.model.loops import same_path
from linter.model.window_sums import is_batch_size

if TYPE_CHECKING:
    from linter.model import Model

DIVIDED, UNDIVIDED, UNKNOWN = FlowState.DIVIDED, FlowState.UNDIVIDED, FlowState.UNKNOWN
_DIV_METHODS = {"div", "div_", "divide", "true_divide"}
_PASS_METHODS = {
    "mean",
    "sum",
    "float",
    "double",
    "half",
    "bfloat16",
    "to",
    "squeeze",
    "clone",
    "contiguous",
    "view",
    "reshape",
    "cuda",
    "cpu",
    "values",  # `sum(loss_dict.values())`: the dict a model returned
    "items",  # `sum(v for k, v in loss_dict.items() if "loss" in k)`
    "get",
    "pop",
}
_LOSS_FN_NAME = re.compile(r"^(crit(erion)?\w*|loss_(fn|fct|func|function)|lossfn|\w*_criterion)$")
# Names that may hold K or 1/K: an opaque call or factor given one of them may divide.
_MAY_HOLD_K = re.compile(r"acc(um|_)|grad_?acc|(^|_)inv(_|$)|recip|scale|norm|denom", re.I)
_BUILTIN_REDUCTIONS = {"sum", "max", "min", "abs", "float"}
_NO_GRAD = {"torch.no_grad", "torch.inference_mode"}


@dataclass
class Flow:
    state: FlowState
    steps: list[tuple[str, Stmt]] = field(default_factory=list)
    divisors: list[cst.BaseExpression] = field(default_factory=list)
    models: set[str] = field(default_factory=set)
    opaque: list[cst.Call] = field(default_factory=list)  # calls the linter cannot see into
    # factors that make the loss a sum over the micro-batch's samples (`loss * x.size(0)`)
    per_sample: list[cst.BaseExpression] = field(default_factory=list)


_PARSE_CALLS = ("parse_args", "parse_known_args", "parse_args_into_dataclasses")


def _combine(*states: str) -> str:
    if DIVIDED in states:
        return DIVIDED
    if UNKNOWN in states:
        return UNKNOWN
    return UNDIVIDED


def _is_reciprocal(node: cst.CSTNode) -> bool:
    """`1 / K` or `1.0 / K`."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        left = node.left
        return (isinstance(left, cst.Integer) and int_value(left) == 1) or (
            isinstance(left, cst.Float) and float(left.value) == 1.0
        )
    return False


def _is_number(node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.Integer, cst.Float))


class Tracer:
    """Follows one loss expression backwards through assignments in its function."""

    def __init__(self, model: Model, scope: Scope) -> None:
        self.model = model
        self.scope = scope
        self.flow = Flow(UNKNOWN)
        self._seen: dict[int, str] = {}  # id(Def) -> its state (UNKNOWN while in progress)
        self._bound: dict[str, str] = {}  # names a comprehension binds -> their iterable's state

    def trace(self, expr: cst.BaseExpression, order: int) -> Flow:
        self.flow.state = self._expr(expr, self.scope, order, 0, None)
        self.flow.steps.sort(key=lambda step: step[1].order)
        return self.flow

    # expressions ---------------------------------------------------------------
    def _expr(self, node, scope: Scope, order: int, depth: int, index: int | None) -> str:
        if depth > FOLLOW_DEPTH:
            return UNKNOWN
        text = dotted(node)
        if text is not None:
            return self._name(node, text, scope, order, depth, index)
        if isinstance(node, cst.BinaryOperation):
            return self._binary(node, scope, order, depth)
        if isinstance(node, cst.Call):
            return self._call(node, scope, order, depth, index)
        if isinstance(node, cst.Attribute):
            return self._expr(node.value, scope, order, depth, None)
        if isinstance(node, cst.Subscript):
            return self._expr(node.value, scope, order, depth, None)
        if isinstance(node, cst.UnaryOperation):  # `-F.logsigmoid(margin).mean()`
            return self._expr(node.expression, scope, order, depth, index)
        if isinstance(node, cst.IfExp):  # `out["loss"] if isinstance(out, dict) else out[0]`
            return _combine(
                self._expr(node.body, scope, order, depth, index),
                self._expr(node.orelse, scope, order, depth, index),
            )
        if isinstance(node, cst.Tuple) and index is not None and index < len(node.elements):
            return self._expr(node.elements[index].value, scope, order, depth, None)
        if isinstance(node, (cst.Dict, cst.List, cst.Tuple)) and index is None:
            return self._collection(node, scope, order, depth)
        if isinstance(node, (cst.GeneratorExp, cst.ListComp, cst.SetComp)):
            return self._comprehension(node, scope, order, depth)
        return UNKNOWN

    def _comprehension(self, node, scope: Scope, order: int, depth: int) -> str:
        """`sum(v for k, v in out.items() if "loss" in k)`: the element, with the names the
        comprehension binds standing for its iterables (`v / accum` divides, `v` does not)."""
        bound = dict(self._bound)
        clause = node.for_in
        while clause is not None:
            state = self._expr(clause.iter, scope, order, depth + 1, None)
            for name in _target_names(clause.target):
                bound[name] = state
            clause = clause.inner_for_in
        outer, self._bound = self._bound, bound
        try:
            return self._expr(node.elt, scope, order, depth + 1, None)
        finally:
            self._bound = outer

    def _collection(self, node, scope: Scope, order: int, depth: int) -> str:
        """`{"dice": dice, "bce": bce}` or `[l1, l2]` later summed: as divided as its losses."""
        states = []
        for element in node.elements:
            if isinstance(element, (cst.StarredElement, cst.StarredDictElement)):
                return UNKNOWN
            states.append(self._expr(element.value, scope, order, depth, None))
        return _combine(*states) if states else UNKNOWN

    def _name(self, node, text: str, scope: Scope, order: int, depth: int, index) -> str:
        head = text.split(".", 1)[0]
        if head in self._bound:
            return self._bound[head]
        defs = _reaching(scope.defs_before(text, order), scope, order)
        if defs:
            return self._def(defs[-1], scope, depth)
        scaled = self.model.scale_loss_source(text, scope)
        if scaled is not None:
            return self._expr(scaled, scope, order, depth + 1, None)
        if isinstance(node, cst.Attribute):
            return self._expr(node.value, scope, order, depth, None)
        if text in scope.params:
            return self._param(text, scope, depth)
        return UNKNOWN

    def _param(self, name: str, scope: Scope, depth: int) -> str:
        """A parameter is what this module's callers pass for it (`backward_and_log(loss)`);
        unknown when no caller is visible. The callers' models are not this scope's names."""
        sites = self.model.argument_sites(scope, name)
        if not sites:
            return UNKNOWN
        models = set(self.flow.models)
        states = [self._expr(e, s.scope, s.order, depth + 1, None) for e, s in sites]
        self.flow.models = models
        return _combine(*states)

    def _def(self, d: Def, scope: Scope, depth: int) -> str:
        """The state of one assignment, computed once (a value read twice, as in both arms of
        `a if c else b`, gets the same answer; a cycle reads as unknown)."""
        if id(d) in self._seen:
            return self._seen[id(d)]
        self._seen[id(d)] = UNKNOWN
        self._seen[id(d)] = state = self._def_state(d, scope, depth)
        return state

    def _def_state(self, d: Def, scope: Scope, depth: int) -> str:
        if scope is self.scope:
            self.flow.steps.append((code(d.stmt.node), d.stmt))
        order = d.stmt.order
        if self._without_grad(d.stmt):
            return UNDIVIDED  # a constant for autograd: no model's gradient flows through it
        if d.op == "=":
            return self._expr(d.value, scope, order, depth, d.tuple_index)
        previous = self._previous(d, scope, depth)
        if d.op in ("/=", "//="):
            if int_value(d.value) == 1:
                return previous
            self.flow.divisors.append(d.value)
            return DIVIDED
        if d.op == "*=":
            if _is_reciprocal(d.value) or self._holds_reciprocal(d.value, scope, order):
                self.flow.divisors.append(d.value)
                return DIVIDED
            if _is_number(d.value):
                return previous
            return self._product([(previous, None), self._factor(d.value, scope, order, depth)])
        if d.op in ("+=", "-="):
            return _combine(previous, self._expr(d.value, scope, order, depth, None))
        return UNKNOWN

    def _without_grad(self, stmt: Stmt) -> bool:
        for frame in stmt.frames:
            if frame.kind == FrameKind.WITH:
                for item in frame.node.items:
                    func = item.item.func if isinstance(item.item, cst.Call) else None
                    if (self.model.imports.qualify(func) or "") in _NO_GRAD:
                        return True
        return False

    def _previous(self, d: Def, scope: Scope, depth: int) -> str:
        defs = scope.defs_before(d.target, d.stmt.order)
        return self._def(defs[-1], scope, depth) if defs else UNKNOWN

    def _holds_reciprocal(self, node, scope: Scope, order: int) -> bool:
        text = dotted(node)
        if text is None:
            return False
        defs = scope.defs_before(text, order) or self.model.module_defs(text)
        return bool(defs) and defs[-1].op == "=" and _is_reciprocal(defs[-1].value)

    def _binary(self, node: cst.BinaryOperation, scope: Scope, order: int, depth: int) -> str:
        op = node.operator
        if isinstance(op, (cst.Divide, cst.FloorDivide)):
            left = self._expr(node.left, scope, order, depth, None)
            if int_value(node.right) == 1:
                return left
            self.flow.divisors.append(node.right)
            return DIVIDED
        if isinstance(op, cst.Multiply):
            for mine, other in ((node.left, node.right), (node.right, node.left)):
                if _is_reciprocal(other) or self._holds_reciprocal(other, scope, order):
                    self._expr(mine, scope, order, depth, None)
                    self.flow.divisors.append(other)
                    return DIVIDED
                if _is_number(other):
                    return self._expr(mine, scope, order, depth, None)
            return self._product(
                [self._factor(side, scope, order, depth) for side in (node.left, node.right)]
            )
        if isinstance(op, (cst.Add, cst.Subtract)):
            # a number (`1 - cosine_similarity(...)`) shifts the loss but carries no gradient
            sides = [side for side in (node.left, node.right) if not _is_number(side)]
            return _combine(*(self._expr(side, scope, order, depth, None) for side in sides))
        return UNKNOWN

    def _factor(self, node, scope: Scope, order: int, depth: int):
        """(state, node) of one side of a product."""
        if is_batch_size(self.model, node, scope, order):
            self.flow.per_sample.append(node)
        return self._expr(node, scope, order, depth, None), node

    def _product(self, factors) -> str:
        """A product divides when a factor does; a factor of unknown value (a loss weight, the
        world size) leaves the loss as undivided as the other factors, unless it may hold 1/K."""
        states = [state for state, _ in factors]
        if DIVIDED in states:
            return DIVIDED
        if any(
            state == UNKNOWN and node is not None and _may_hold_k(node) for state, node in factors
        ):
            return UNKNOWN
        known = [state for state in states if state != UNKNOWN]
        return _combine(*known) if known else UNKNOWN

    # calls -------------------------------------------------------------------------
    def _call(self, node: cst.Call, scope: Scope, order: int, depth: int, index) -> str:
        scaled = self.model.scaled_loss(node, scope)
        if scaled is not None:  # `scaler.scale(loss)` multiplies by S, which unscale_ undoes
            return self._expr(scaled, scope, order, depth, None)
        pair = method_call(node)
        qual = self.model.imports.qualify(node.func) or ""
        if qual in ("torch.div", "torch.true_divide", "torch.divide"):
            self.flow.divisors.extend(positional(node)[1:2])
            return DIVIDED
        if qual in ("torch.mean", "torch.sum") and positional(node):
            return self._expr(positional(node)[0], scope, order, depth, None)
        if pair is not None and not self.model.imports.is_imported(node.func):
            receiver, method = pair
            if method in _DIV_METHODS:
                self.flow.divisors.extend(positional(node)[:1])
                return DIVIDED
            if method in ("mul", "mul_", "multiply") and positional(node):
                factor = positional(node)[0]
                if _is_reciprocal(factor) or self._holds_reciprocal(factor, scope, order):
                    self.flow.divisors.append(factor)
                    return DIVIDED
                if _is_number(factor):
                    return self._expr(receiver, scope, order, depth, None)
                # `loss.sum().mul(loss_scaling / batch_gpu_total)`: a product, as `*` is
                return self._product(
                    [self._factor(side, scope, order, depth) for side in (receiver, factor)]
                )
            if method in _PASS_METHODS:
                return self._expr(receiver, scope, order, depth, None)
            if method == "detach":
                return UNDIVIDED
        local = self.model.local_function(node.func, scope)
        if local is not None:
            return self._returns(local, depth, index)
        if self.model.defines_function(node.func):
            self._args(node, scope, order, depth)
            return UNKNOWN  # the module's own function, but not one we can pick out
        if qual.startswith("torch.nn.functional.") or self._is_loss_object(node.func, scope):
            self._args(node, scope, order, depth)
            if self._custom_loss_object(node.func, scope):
                self.flow.opaque.append(node)
            return UNDIVIDED
        if self._is_object(node.func, scope, order):
            self.flow.models.add(code(node.func))
            if any(a.keyword and a.keyword.value == "num_items_in_batch" for a in node.args):
                self._args(node, scope, order, depth)
                return DIVIDED  # the model normalises by the window's item count
            self._args(node, scope, order, depth)
            if self._custom_loss_object(node.func, scope):
                self.flow.opaque.append(node)
            return UNDIVIDED
        if (qual.startswith("torch.") or qual in _BUILTIN_REDUCTIONS) and node.args:
            return self._tensor_function(node, scope, order, depth)
        return self._opaque(node, scope, order, depth)

    def _tensor_function(self, node: cst.Call, scope: Scope, order: int, depth: int) -> str:
        """`torch.stack(losses)`, `torch.cat(...)`: as divided as the tensors handed to it."""
        states = [self._expr(a.value, scope, order, depth + 1, None) for a in node.args]
        return _combine(*states)

    def _opaque(self, node: cst.Call, scope: Scope, order: int, depth: int) -> str:
        """An imported function or an unknown object's method: it cannot be seen into. A parsed
        command line (`args = parser.parse_args()`) holds settings, not a loss: `args.weight *
        loss` is as divided as `loss`, and the parser is not where the loss comes from."""
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in _PARSE_CALLS:
            return UNKNOWN
        self._args(node, scope, order, depth)
        if any(_may_hold_k(a.value) for a in node.args):
            return UNKNOWN  # handed K (`compute_loss(batch, args.accum)`): it may divide
        self.flow.opaque.append(node)
        return UNDIVIDED

    def _args(self, node: cst.Call, scope: Scope, order: int, depth: int) -> None:
        """Trace arguments only to learn which models the loss comes from."""
        opaque, per_sample = len(self.flow.opaque), len(self.flow.per_sample)
        for arg in node.args:
            self._expr(arg.value, scope, order, depth + 1, None)
        del self.flow.opaque[opaque:]  # calls inside the inputs are not on the loss's path
        del self.flow.per_sample[per_sample:]

    def _returns(self, scope: Scope, depth: int, index: int | None) -> str:
        if not scope.returns:
            return UNKNOWN
        states = []
        for value, stmt in scope.returns:
            states.append(self._expr(value, scope, stmt.order + 1, depth + 1, index))
        return _combine(*states)

    def _is_loss_object(self, func, scope: Scope) -> bool:
        text = dotted(func)
        if text is None:
            return False
        if _LOSS_FN_NAME.match(text.rsplit(".", 1)[-1]):
            return True
        defs = scope.defs.get(text) or self.model.module_defs(text)
        for d in defs or ():
            if isinstance(d.value, cst.Call):
                qual = self.model.imports.qualify(d.value.func) or ""
                if qual.startswith("torch.nn.") and qual.endswith("Loss"):
                    return True
        return False

    def _custom_loss_object(self, func, scope: Scope) -> bool:
        """A loss object built from an imported class outside torch (YOLO's `ComputeLoss`): its
        reduction is the author's choice, so a fix that divides it is not safe."""
        text = dotted(func)
        if text is None or "loss" not in text.lower():
            return False
        if text in scope.params and not scope.defs.get(text):
            return self._loss_parameter_unseen(text, scope)
        for d in scope.defs.get(text) or self.model.module_defs(text):
            if isinstance(d.value, cst.Call) and self.model.imports.is_imported(d.value.func):
                qual = self.model.imports.qualify(d.value.func) or ""
                if not qual.startswith("torch."):
                    return True
        return False

    def _loss_parameter_unseen(self, name: str, scope: Scope) -> bool:
        """A loss callable passed in (`def train(model, compute_loss): ...`): its reduction is
        seen only when every caller of the module hands a torch loss (`nn.MSELoss()`,
        `F.cross_entropy`); otherwise it is the author's choice, as for an imported helper."""
        sites = self.model.argument_sites(scope, name)
        return not sites or not all(self._torch_loss(expr, stmt) for expr, stmt in sites)

    def _torch_loss(self, expr: cst.BaseExpression, stmt: Stmt) -> bool:
        """`F.mse_loss`, `nn.MSELoss()`, or a name bound to `nn.MSELoss()`."""
        if (self.model.imports.qualify(expr) or "").startswith("torch.nn.functional."):
            return True
        text = dotted(expr)
        defs = (
            (stmt.scope.defs_before(text, stmt.order) or self.model.module_defs(text))
            if text
            else []
        )
        value = defs[-1].value if defs and defs[-1].op == "=" else expr
        if not isinstance(value, cst.Call):
            return False
        built = self.model.imports.qualify(value.func) or ""
        return built.startswith("torch.nn.") and built.endswith("Loss")

    def _is_object(self, func, scope: Scope, order: int) -> bool:
        """A call of an object held in a variable: a model, not a function we cannot see."""
        text = dotted(func)
        if text is None or self.model.imports.is_imported(func):
            return False
        if text in self.model.setup.prepared or text in self.model.setup.ddp_models:
            return True
        if "." not in text:
            return bool(scope.defs.get(text)) or text in scope.params
        head = text.split(".", 1)[0]
        if head == "self" and text.count(".") == 1:
            return bool(self.model.module_defs(text))
        return False


def _target_names(target: cst.BaseExpression) -> list[str]:
    """The names a `for` target binds: `v`, `k, v`, `(i, (k, v))`."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _target_names(element.value)]
    return []


def _may_hold_k(node: cst.CSTNode) -> bool:
    """Whether an expression's text names something that may be K or 1/K."""
    return bool(_MAY_HOLD_K.search(code(node)))


def _reaching(defs: list[Def], scope: Scope, order: int) -> list[Def]:
    """The assignments that can reach the statement at `order`: one in the other branch of an
    `if` it sits in (`elif engine: loss = engine.backward(loss)` beside `else:
    loss.backward()`) never holds its value there. All of them when none can be told apart."""
    if len(defs) < 2:
        return defs
    reader = scope.statement_at(order)
    if reader is None:
        return defs
    return [d for d in defs if same_path(d.stmt, reader)] or defs


def trace_loss(model: Model, scope: Scope, expr: cst.BaseExpression, stmt: Stmt) -> Flow:
    return Tracer(model, scope).trace(expr, stmt.order)
