"""A window that sums its micro-batches on purpose: signs that the author wants the gradient of
the window's sum over samples, not of its mean (ACL301 must not ask for a division then).

Two signs count. A loss multiplied by the micro-batch's size (`loss * x.size(0)`, YOLO's
`(lbox + lobj + lcls) * bs`) is a sum over samples by construction. And a coupled weight decay
rescaled by the window's sample count (`hyp["weight_decay"] *= batch_size * accumulate / nbs`)
keeps the decay in step with a gradient that grows with the samples of the window, which only
makes sense when that gradient is a sum. Neither is true of a learning rate scaled with the
effective batch, which is the usual companion of a mean loss.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import code, dotted, int_value, last_part, string_value, walk
from linter.model.functions import Scope

if TYPE_CHECKING:
    from linter.model import Model

_BATCH_SIZE = re.compile(
    r"^(bs|batch_?size|batch_?sz|\w+_batch_size|(mini|micro)_?batch(_?size)?|n_?samples"
    r"|num_samples)$",
    re.I,
)
_DECAY = re.compile(r"(^|_)(weight_?decay|wd)$", re.I)


def is_batch_size(model: Model, node: cst.BaseExpression, scope: Scope, order: int) -> bool:
    """`x.size(0)`, `x.shape[0]`, `len(x)`, a batch-size name, or a name bound to one of them."""
    if _counts_rows(node) or _BATCH_SIZE.match(last_part(dotted(node)) or ""):
        return True
    text = dotted(node)
    defs = (scope.defs_before(text, order) or model.module_defs(text)) if text else []
    return (
        bool(defs)
        and defs[-1].op == "="
        and defs[-1].value is not None
        and (
            _counts_rows(defs[-1].value)
            or _BATCH_SIZE.match(last_part(dotted(defs[-1].value)) or "")
        )
    )


def _counts_rows(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Call):
        func = node.func
        if dotted(func) == "len" and len(node.args) == 1:
            return True
        if isinstance(func, cst.Attribute) and func.attr.value == "size" and len(node.args) == 1:
            return int_value(node.args[0].value) == 0
        return False
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if not isinstance(index, cst.Index) or int_value(index.value) != 0:
            return False
        holder = node.value
        if isinstance(holder, cst.Attribute) and holder.attr.value == "shape":
            return True
        return isinstance(holder, cst.Call) and code(holder.func).endswith(".size")
    return False


def decay_rescaled_by_window(model: Model, k: cst.BaseExpression) -> cst.CSTNode | None:
    """A weight-decay value multiplied by the window's sample count, K times a batch size
    (`hyp["weight_decay"] *= batch_size * accumulate / nbs`): the statement that does it."""
    for scope in model.scopes:
        for stmt in scope.stmts:
            node = stmt.node
            if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.MultiplyAssign):
                target, value = node.target, node.value
            elif isinstance(node, cst.Assign) and len(node.targets) == 1:
                target, value = node.targets[0].target, node.value
            else:
                continue
            if not _DECAY.search(_key(target)):  # cheap first: most statements stop here
                continue
            if isinstance(node, cst.Assign) and not _reads_itself(target, value):
                continue  # `wd = wd * ...` rescales; `wd = 0.05 * bs * K` sets
            if _window_count(model, value, k, scope, stmt.order):
                return node
    return None


def _reads_itself(target: cst.BaseExpression, value: cst.BaseExpression) -> bool:
    text = code(target)
    return any(code(n) == text for n in walk(value))


def _key(target: cst.BaseExpression) -> str:
    """`weight_decay` for `hyp["weight_decay"]`, `cfg.weight_decay` or `weight_decay`."""
    if isinstance(target, cst.Subscript) and len(target.slice) == 1:
        index = target.slice[0].slice
        return (string_value(index.value) if isinstance(index, cst.Index) else None) or ""
    return last_part(dotted(target))


def _window_count(model: Model, value, k, scope: Scope, order: int) -> bool:
    """Whether an expression multiplies K by a batch size (both among its factors)."""
    k_name = last_part(dotted(k)) if dotted(k) else code(k)
    factors = list(_factors(value))
    has_k = any((last_part(dotted(f)) if dotted(f) else code(f)) == k_name for f in factors)
    return has_k and any(is_batch_size(model, f, scope, order) for f in factors)


def _factors(node: cst.BaseExpression):
    """The operands of a chain of `*` and `/` (`batch_size * accumulate / nbs`)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(
        node.operator, (cst.Multiply, cst.Divide, cst.FloorDivide)
    ):
        yield from _factors(node.left)
        yield from _factors(node.right)
    else:
        yield node
