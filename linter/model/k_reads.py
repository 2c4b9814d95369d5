"""Where the accumulation value K is read: handed to an engine, used as a gate, dividing a loss,
in step/learning-rate/batch arithmetic, only logged, or given to a call the linter cannot see into.

ACL313 weighs these reads: K that only enters arithmetic, while nothing applies it, describes
batches that never exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from linter.model.accumulation import PASS_CALLS, is_k_name, short_name, spells_k
from linter.model.cst_util import children, dotted, method_call, string_value, walk
from linter.model.functions import Scope, Stmt
from linter.model.kinds import FrameKind, ReadKind, SiteKind
from linter.model.loops import BACKWARD_KINDS

# Keyword arguments and config keys that hand K to something that accumulates.
_K_KEYS = {"gradient_accumulation_steps", "num_steps", "accumulate_grad_batches", "update_freq"}
_LOG_CALLS = re.compile(
    r"(^|\.)(print|pprint|info|debug|warning|warn|log|log_dict|log_metrics|add_scalar|"
    r"set_postfix|set_description|write|format|echo)$"
)


@dataclass(eq=False)
class Read:
    """One read of K and what it does with K (`ReadKind`)."""

    kind: ReadKind
    node: cst.CSTNode
    stmt: Stmt
    target: str | None = None  # the name an arithmetic read is assigned to


def k_reads(model) -> list[Read]:
    return model.memo("accumulation.reads", _k_reads)


def _k_reads(model) -> list[Read]:
    reads = []
    for scope in model.scopes:
        for stmt in scope.stmts:
            reads.extend(_reads_in(model, stmt.node, stmt, _target(stmt)))
        for node, stmt in _headers(scope):
            for read in _reads_in(model, node, stmt, None):
                if read.kind in (ReadKind.ARITHMETIC, ReadKind.ALIAS):
                    read.kind = ReadKind.GATE  # a loop or `if` header decides what runs
                reads.append(read)
    divisors = _division_nodes(model)
    for read in reads:
        if read.kind == ReadKind.ARITHMETIC and id(read.node) in divisors:
            read.kind = ReadKind.DIVISION
        elif read.kind == ReadKind.ARITHMETIC and _only_logged(model, read):
            read.kind = ReadKind.LOG
    return reads


def _headers(scope: Scope):
    """(test or iterable, first statement inside) of each `if`/loop header of the scope."""
    seen = set()
    for stmt in scope.stmts:
        for frame in stmt.frames:
            if id(frame.node) in seen or frame.kind not in (FrameKind.IF, FrameKind.LOOP):
                continue
            seen.add(id(frame.node))
            node = frame.node
            header = node.iter if isinstance(node, cst.For) else getattr(node, "test", None)
            if header is not None:
                yield header, stmt


def _target(stmt: Stmt) -> str | None:
    node = stmt.node
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        return dotted(node.targets[0].target)
    if isinstance(node, (cst.AnnAssign, cst.AugAssign)):
        return dotted(node.target)
    return None


def _reads_in(model, root, stmt: Stmt, target: str | None) -> list[Read]:
    found = []
    stack = [(root, ())]
    while stack:
        node, parents = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) and _is_read(
            node, parents
        ):
            if spells_k(model, node, stmt.scope, stmt.order):
                found.append(Read(_kind(model, node, parents), node, stmt, target))
                continue
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and parents:
            continue
        for child in children(node):
            stack.append((child, parents + (node,)))
    return found


def _is_read(node, parents) -> bool:
    """Not an attribute's or a call's inner part, not an assignment target, not a keyword."""
    if not parents:
        return True
    parent = parents[-1]
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return False
    if isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is node:
        return False
    if isinstance(parent, cst.Call) and parent.func is node:
        return False
    if isinstance(parent, cst.Arg) and parent.keyword is node:
        return False
    if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
        return getattr(parent, "target", None) is not node
    return not isinstance(parent, (cst.Param, cst.ImportAlias))


def _kind(model, node, parents) -> ReadKind:
    if any(_is_log(model, p) for p in parents):
        return ReadKind.LOG
    child = node
    for parent in reversed(parents):
        if isinstance(parent, cst.BinaryOperation):
            return ReadKind.GATE if isinstance(parent.operator, cst.Modulo) else ReadKind.ARITHMETIC
        if isinstance(parent, cst.Comparison):
            return ReadKind.GATE
        if isinstance(parent, cst.Arg):
            if parent.keyword is not None and parent.keyword.value in _K_KEYS:
                return ReadKind.ENGINE
        elif isinstance(parent, cst.DictElement):
            if string_value(parent.key) in _K_KEYS or is_k_name(string_value(parent.key)):
                return ReadKind.ENGINE
            return ReadKind.CALL
        elif isinstance(parent, cst.Call) and child is not parent.func:
            name = dotted(parent.func) or ""
            if name in PASS_CALLS:
                child = parent
                continue
            return ReadKind.GATE if name == "range" else ReadKind.CALL
        elif isinstance(parent, (cst.Assign, cst.AnnAssign)):
            return ReadKind.ENGINE if _k_key_target(parent) else ReadKind.ALIAS
        elif isinstance(parent, cst.AugAssign):
            return ReadKind.ARITHMETIC
        elif isinstance(parent, (cst.Return, cst.Yield)):
            return ReadKind.CALL
        child = parent
    return ReadKind.ALIAS


def _k_key_target(assign) -> bool:
    """`ds_config["gradient_accumulation_steps"] = K`."""
    targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else []
    return any(isinstance(t, cst.Subscript) and short_name(t) in _K_KEYS for t in targets)


def _is_log(model, node) -> bool:
    if isinstance(node, (cst.FormattedString, cst.ConcatenatedString)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return isinstance(node.left, (cst.SimpleString, cst.ConcatenatedString))
    if isinstance(node, cst.Call):
        name = dotted(node.func) or ""
        pair = method_call(node)
        if pair is not None and pair[1] == "format" and isinstance(pair[0], cst.SimpleString):
            return True
        return bool(_LOG_CALLS.search(name)) or "logger" in name or "wandb" in name
    return False


def _division_nodes(model) -> set[int]:
    """The divisors (and their parts) of every loss that reaches a backward, and of gradients
    divided in place (`p.grad /= K`, `p.grad.div_(K)`)."""
    found: set[int] = set()
    for sites in model.sites.values():
        for site in sites:
            nodes = []
            if site.kind in BACKWARD_KINDS:
                flow = model.flow(site)
                nodes = list(flow.divisors) if flow is not None else []
            elif site.kind == SiteKind.GRAD_DIV:
                nodes = [site.stmt.node] if site.call is None else list(site.call.args)
            for node in nodes:
                found.update(id(sub) for sub in walk(node))
    return found


def _only_logged(model, read: Read) -> bool:
    """`total_batch = bs * K` read only to be printed: the arithmetic sizes nothing."""
    if read.target is None or "." in read.target:
        return False
    uses = [r for r in _name_reads(read.stmt.scope, read.target) if r is not read.stmt]
    return bool(uses) and all(_logs_name(model, stmt, read.target) for stmt in uses)


def _name_reads(scope: Scope, name: str) -> list[Stmt]:
    found = []
    for stmt in scope.stmts:
        if any(isinstance(n, cst.Name) and n.value == name for n in walk(stmt.node)):
            found.append(stmt)
    return found


def _logs_name(model, stmt: Stmt, name: str) -> bool:
    """Every read of `name` in the statement sits inside a print or log call."""
    return not [
        r for r in _name_nodes(stmt.node, name, ()) if not any(_is_log(model, p) for p in r)
    ]


def _name_nodes(node, name: str, parents):
    if isinstance(node, cst.Name) and node.value == name:
        yield parents
        return
    for child in children(node):
        yield from _name_nodes(child, name, parents + (node,))
