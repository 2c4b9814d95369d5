"""ACL311: a `weight_decay` multiplied or divided by the accumulation value K."""

from __future__ import annotations

import re

import libcst as cst

from linter.context import RuleContext
from linter.model import accumulation
from linter.model.config_space import k_configuration
from linter.model.cst_util import code, dotted, keyword, string_value, strip_parens, walk

_LR_NAME = re.compile(r"(^|\W|_)(lr|learning_rate)(\W|_|$)", re.I)
_SCALING = (cst.Multiply, cst.Divide, cst.FloorDivide)


def check(ctx: RuleContext) -> None:
    """Report each weight decay whose expression scales by K."""
    model = ctx.model
    for value, stmt in _weight_decays(model):
        k = _scaling_k(model, value, stmt)
        if k is not None:
            ctx.report(
                value,
                f"`weight_decay` is scaled by the accumulation steps `{code(k)}`: the optimizer "
                "applies weight decay once per step, on the averaged gradient, so scaling it by "
                "K makes regularisation K times off the large-batch run; use the unscaled value",
                configuration=k_configuration(model, k, stmt.scope),
            )


def _weight_decays(model):
    """(value, statement) of `weight_decay=` arguments and of `"weight_decay":` entries in the
    literal parameter groups of assignments and call arguments."""
    seen = set()
    for call in model.calls:
        value = keyword(call.call, "weight_decay")
        if value is not None and id(value) not in seen:
            seen.add(id(value))
            yield value, call.stmt
        for arg in call.call.args:
            yield from _group_entries(arg.value, call.stmt, seen)
    for scope in model.scopes:
        for defs in scope.defs.values():
            for d in defs:
                yield from _group_entries(d.value, d.stmt, seen)


def _group_entries(value, stmt, seen):
    """`{"params": ..., "weight_decay": wd}`, a list or tuple of such dicts, or a comprehension
    building them (exact types: the ABC isinstance is slow on every argument of a module)."""
    kind = type(value)
    if kind is cst.ListComp and type(value.elt) is cst.Dict:
        groups = [value.elt]
    elif kind in (cst.List, cst.Tuple):
        groups = [e.value for e in value.elements if type(e.value) is cst.Dict]
    else:
        groups = [value] if kind is cst.Dict else []
    for group in groups:
        for element in group.elements:
            if type(element) is cst.DictElement and string_value(element.key) == "weight_decay":
                if id(element.value) not in seen:
                    seen.add(id(element.value))
                    yield element.value, stmt


def _scaling_k(model, value, stmt):
    """The K operand of a product or quotient in the decay (through a name bound once to
    one); a K that scales a learning rate inside it (`wd / (lr * K)`) is the rate's business."""
    value = strip_parens(value)
    text = dotted(value)
    if text is not None:
        defs = stmt.scope.defs_before(text, stmt.order) or model.module_defs(text)
        if len(defs) != 1 or defs[0].op != "=":
            return None
        value, stmt = strip_parens(defs[0].value), defs[0].stmt
    for node in walk(value):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _SCALING):
            for mine, other in ((node.left, node.right), (node.right, node.left)):
                if _LR_NAME.search(code(other)):
                    continue
                if accumulation.spells_k(model, mine, stmt.scope, stmt.order):
                    return mine
    return None
