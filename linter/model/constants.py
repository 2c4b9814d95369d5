"""Integer values the module fixes in code: a literal, or a name bound once to one.

`ACCUM_STEPS = 4` at module level, read by the step gate `(i + 1) % ACCUM_STEPS == 0` or by a
function, is 4 wherever it is read. A name bound more than once (in any scope, by any means: an
assignment, an augmented assignment, a loop or `with` target, a parameter, an import) has no
value known here, nor has any name of a module with a star import (which may rebind it).
"""

from __future__ import annotations

import libcst as cst

from linter.model.cst_util import dotted, strip_parens, walk
from linter.model.cst_util import int_value as literal_value
from linter.model.depths import FOLLOW_DEPTH


def int_value(model, node: cst.CSTNode | None) -> int | None:
    """The integer `node` is known to hold: a literal, or a name the module binds exactly once
    (with `=`) to an expression that has such a value."""
    return _value(model, node, 0)


def _value(model, node, depth: int) -> int | None:
    node = strip_parens(node) if isinstance(node, cst.BaseExpression) else node
    number = literal_value(node)
    if number is not None or not isinstance(node, cst.Name) or depth >= FOLLOW_DEPTH:
        return number
    name = node.value
    if name in _other_bindings(model):
        return None
    defs = model.module_defs(name)
    if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
        return None
    return _value(model, defs[0].value, depth + 1)


def _other_bindings(model) -> set[str] | _Everything:
    return model.memo("constants.other_bindings", _find_other_bindings)


class _Everything:
    """Every name: a star import may bind any of them."""

    def __contains__(self, name: object) -> bool:
        return True


def _find_other_bindings(model) -> set[str] | _Everything:
    """Names bound other than by an assignment statement: loop and `with` targets, parameters,
    imports."""
    found = set(model.imports.aliases)
    for scope in model.scopes:
        found.update(scope.params)
        for loop in scope.loops:
            if isinstance(loop, cst.For):
                found.update(_names(loop.target))
        for with_node, _ in scope.withs:
            for item in with_node.items:
                if item.asname is not None:
                    found.update(_names(item.asname.name))
    for stmt in model.scopes[0].stmts:
        if isinstance(stmt.node, cst.ImportFrom) and isinstance(stmt.node.names, cst.ImportStar):
            return _Everything()
    return found


def _names(target: cst.CSTNode) -> list[str]:
    return [n.value for n in walk(target) if isinstance(n, cst.Name)] + [
        text for n in [target] if (text := dotted(n)) is not None
    ]
