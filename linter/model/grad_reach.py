"""Whether what a `with` region computes can reach a backward of its function.

A region whose values never reach a loss that is backpropagated (a validation pipeline run
every few epochs inside the training loop, a frozen helper model whose output is quantised to
`uint8` before use) trains nothing, whatever dtype it runs in. The question is answered by
names, over the statements of one function in any order (a loop makes every statement a
possible predecessor of every other): a backward's statement reads some names, the statements
binding those names read others, and so on; a name read only through a call that cuts the
gradient (`.detach()`, `.item()`, a cast to an integer dtype) is not followed.
"""

from __future__ import annotations

import libcst as cst

from linter.model.cst_util import code
from linter.model.functions import Scope, Stmt
from linter.model.kinds import SiteKind

_BACKWARDS = (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD)
_CUTS = {"detach", "item", "tolist", "numpy", "long", "int", "bool", "byte", "short"}
_INTEGER_DTYPES = {"uint8", "int8", "int16", "int32", "int64", "long", "int", "bool", "short"}
# in-place methods that change the object they are called on (`losses.append(aux)`)
_MUTATORS = {"append", "extend", "insert", "update", "add_", "copy_", "mul_", "div_"}


def feeds_a_backward(model, scope: Scope | None, with_node: cst.With) -> bool | None:
    """True when a backward of `scope` may depend on a value bound inside `with_node` (or runs
    inside it, or the region returns a value); False when none can; None when the scope has no
    backward of its own (what the caller does with the values is out of sight)."""
    if scope is None:
        return None
    backwards = [s.stmt for s in model.sites.get(id(scope), []) if s.kind in _BACKWARDS]
    if not backwards:
        return None
    inside = [s for s in scope.stmts if any(f.node is with_node for f in s.frames)]
    inside_ids = {id(s) for s in inside}
    if any(id(s) in inside_ids for s in backwards) or any(_escapes(s.node) for s in inside):
        return True
    bound_inside = set().union(*(_binds(s.node) for s in inside)) if inside else set()
    return bool(bound_inside & _read_by_backwards(scope, backwards))


def _read_by_backwards(scope: Scope, backwards: list[Stmt]) -> set[str]:
    """Every name a backward's loss may depend on, through the statements of the scope."""
    wanted = set().union(*(_reads(s.node) for s in backwards))
    flows = [(_binds(s.node), _reads(s.node)) for s in scope.stmts]
    changed = True
    while changed:
        changed = False
        for binds, reads in flows:
            if binds & wanted and not reads <= wanted:
                wanted |= reads
                changed = True
    return wanted


def _escapes(node: cst.BaseSmallStatement) -> bool:
    return isinstance(node, cst.Return) or (
        isinstance(node, cst.Expr) and isinstance(node.value, (cst.Yield, cst.Await))
    )


def _binds(node: cst.BaseSmallStatement) -> set[str]:
    """The names (and `self.x` attributes) a statement assigns or changes in place."""
    targets: list[cst.BaseExpression] = []
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, cst.Expr) and isinstance(node.value, cst.Call):
        func = node.value.func
        if isinstance(func, cst.Attribute) and func.attr.value in _MUTATORS:
            targets = [func.value]
    found: set[str] = set()
    for target in targets:
        found |= _target_names(target)
    return found


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(set(), *(_target_names(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    if isinstance(target, cst.Subscript):
        return _target_names(target.value)
    if isinstance(target, (cst.Name, cst.Attribute)):
        return {code(target)}
    return set()


def _reads(node: cst.CSTNode) -> set[str]:
    """The names a statement reads, each attribute chain as all its prefixes (`out.loss`:
    `out`, `out.loss`), leaving out what is read only through a gradient cut."""
    found: set[str] = set()
    stack: list[cst.CSTNode] = [node]
    while stack:
        sub = stack.pop()
        if isinstance(sub, cst.Call) and _cuts_gradient(sub):
            stack.extend(a.value for a in sub.args)  # `x.to(torch.uint8)`: `x` is cut
            continue
        if isinstance(sub, (cst.Name, cst.Attribute)):
            chain = _chain(sub)
            if chain is not None:
                found |= {".".join(chain[: i + 1]) for i in range(len(chain))}
                continue
        stack.extend(sub.children)
    return found


def _chain(node: cst.BaseExpression) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None when the chain does not start at a name."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    return [node.value, *reversed(parts)]


def _cuts_gradient(call: cst.Call) -> bool:
    """`x.detach()`, `x.item()`, `x.long()`, `x.to(torch.uint8)`: no gradient flows to `x`."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    method = func.attr.value
    if method in _CUTS:
        return True
    if method == "to":
        return any(code(a.value).rsplit(".", 1)[-1] in _INTEGER_DTYPES for a in call.args)
    return False
