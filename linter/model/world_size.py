"""World-size expressions (`dist.get_world_size()`, `accelerator.num_processes`, `WORLD_SIZE`
from the environment) and the divisions by them on a loss's way to its backward."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    dotted,
    last_part,
    method_call,
    string_value,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Def, Scope, Stmt

if TYPE_CHECKING:
    from linter.model import Model

_WORLD_SIZE_NAME = re.compile(r"^(\w+_)?world_size$|^num_processes$|^n_?gpus$", re.I)


# world size ---------------------------------------------------------------------------------
def is_world_size(model: Model, node: cst.CSTNode, scope: Scope, depth: int = 0) -> bool:
    """`dist.get_world_size()`, `accelerator.num_processes`, `args.world_size`,
    `int(os.environ["WORLD_SIZE"])`, or a name bound to one of them."""
    if depth > FOLLOW_DEPTH:
        return False
    if isinstance(node, cst.Call):
        qual = model.imports.qualify(node.func) or ""
        if last_part(qual) == "get_world_size":
            return True
        if qual in ("int", "float") and node.args:
            return is_world_size(model, node.args[0].value, scope, depth + 1)
        if last_part(qual) in ("getenv", "get") and node.args:
            return string_value(node.args[0].value) == "WORLD_SIZE"
        return False
    if isinstance(node, cst.Subscript):
        return any(
            isinstance(e.slice, cst.Index) and string_value(e.slice.value) == "WORLD_SIZE"
            for e in node.slice
        )
    text = dotted(node)
    if text is None:
        return False
    if _WORLD_SIZE_NAME.match(last_part(text)):
        return True
    defs = scope.defs.get(text) or model.module_defs(text)
    values = [d.value for d in defs if d.op == "=" and d.tuple_index is None]
    return bool(values) and all(is_world_size(model, v, scope, depth + 1) for v in values)


# world-size divisions on a loss's path ---------------------------------------------------
@dataclass(eq=False)
class WorldSizeDivision:
    """`loss / W`, `loss /= W` or `loss / (W * K)` on the way to a backward."""

    node: cst.BinaryOperation | None  # the division expression (None for `/=`)
    divisor: cst.BaseExpression
    world_size: cst.BaseExpression  # W itself (the divisor, or one factor of it)
    rest: cst.BaseExpression | None  # K of `W * K`, else None
    bound: Def | None  # the assignment the division happens in (None: in the backward itself)


@dataclass
class _Path:
    divisions: list[WorldSizeDivision] = field(default_factory=list)
    multiplies_world_size: bool = False  # `loss * W / n_tokens`: a global normalisation


_THROUGH = {
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
}


def world_size_divisions(model: Model, loss, stmt: Stmt) -> list[WorldSizeDivision]:
    """The divisions of a backward's loss by the world size, along its assignments in the
    function. None when the path also multiplies by W (`loss * W / n_items` normalises by a
    global count)."""
    path = _Path()
    _walk_loss(model, loss, stmt.scope, stmt.order, None, path, 0)
    return [] if path.multiplies_world_size else path.divisions


def _walk_loss(model: Model, node, scope: Scope, order: int, bound, path: _Path, depth: int):
    if depth > FOLLOW_DEPTH or node is None:
        return
    text = dotted(node)
    if text is not None:
        defs = scope.defs_before(text, order)
        if defs:
            _walk_def(model, defs[-1], scope, path, depth + 1)
        return
    if isinstance(node, cst.BinaryOperation):
        _walk_binary(model, node, scope, order, bound, path, depth)
    elif isinstance(node, cst.UnaryOperation):
        _walk_loss(model, node.expression, scope, order, bound, path, depth)
    elif isinstance(node, cst.Call):
        scaled = model.scaled_loss(node, scope)
        pair = method_call(node)
        if scaled is not None:
            _walk_loss(model, scaled, scope, order, bound, path, depth)
        elif pair is not None and pair[1] in _THROUGH:
            _walk_loss(model, pair[0], scope, order, bound, path, depth)


def _walk_def(model: Model, d: Def, scope: Scope, path: _Path, depth: int) -> None:
    if d.tuple_index is not None:
        return
    if d.op == "=":
        _walk_loss(model, d.value, scope, d.stmt.order, d, path, depth)
        return
    if d.op == "/=":
        split = _world_size_factor(model, d.value, scope)
        if split is not None:
            path.divisions.append(WorldSizeDivision(None, d.value, split[0], split[1], d))
    elif d.op == "*=" and _has_world_size_factor(model, d.value, scope):
        path.multiplies_world_size = True
    previous = scope.defs_before(d.target, d.stmt.order)
    if previous:
        _walk_def(model, previous[-1], scope, path, depth + 1)


def _walk_binary(model: Model, node, scope: Scope, order: int, bound, path: _Path, depth: int):
    op = node.operator
    if isinstance(op, cst.Divide):
        split = _world_size_factor(model, node.right, scope)
        if split is not None:
            path.divisions.append(WorldSizeDivision(node, node.right, split[0], split[1], bound))
        _walk_loss(model, node.left, scope, order, bound, path, depth)
    elif isinstance(op, cst.Multiply):
        for side in (node.left, node.right):
            if _has_world_size_factor(model, side, scope):
                path.multiplies_world_size = True
            _walk_loss(model, side, scope, order, bound, path, depth)
    elif isinstance(op, (cst.Add, cst.Subtract)):
        _walk_loss(model, node.left, scope, order, bound, path, depth)
        _walk_loss(model, node.right, scope, order, bound, path, depth)


def _world_size_factor(model: Model, divisor, scope: Scope):
    """(W, the other factor or None) when the divisor is W or a product of W and one more."""
    if is_world_size(model, divisor, scope):
        return divisor, None
    if isinstance(divisor, cst.BinaryOperation) and isinstance(divisor.operator, cst.Multiply):
        for mine, other in ((divisor.left, divisor.right), (divisor.right, divisor.left)):
            if is_world_size(model, mine, scope) and not _has_world_size_factor(
                model, other, scope
            ):
                return mine, other
    return None


def _has_world_size_factor(model: Model, node, scope: Scope) -> bool:
    if is_world_size(model, node, scope):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return any(_has_world_size_factor(model, s, scope) for s in (node.left, node.right))
    return False
