"""Small, fast helpers over libcst nodes.

libcst's own visitor machinery costs ~60 ms per 1,000 lines; the model only needs to read the
tree, so it walks the dataclass fields directly (about ten times faster) and skips whitespace.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator

import libcst as cst

_SKIP_PREFIXES = (
    "whitespace",
    "leading_lines",
    "lines_after",
    "header",
    "footer",
    "lpar",
    "rpar",
    "comma",
    "semicolon",
    "equal",
    "colon",
    "star",
    "operator",
    "dot",
    "newline",
    "indent",
    "first_line",
    "last_line",
    "empty_lines",
    "trailing_whitespace",
    "asynchronous",
    "default_indent",
    "default_newline",
    "encoding",
    "has_trailing_newline",
    "lbrace",
    "rbrace",
    "lbracket",
    "rbracket",
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(node_type: type) -> tuple[str, ...]:
    names = _FIELDS.get(node_type)
    if names is None:
        names = tuple(
            f.name for f in dataclasses.fields(node_type) if not f.name.startswith(_SKIP_PREFIXES)
        )
        _FIELDS[node_type] = names
    return names


_IS_NODE: dict[type, bool] = {}


def _is_node(value) -> bool:
    """`isinstance(value, CSTNode)` without the ABC machinery (the walk's hot path)."""
    kind = type(value)
    known = _IS_NODE.get(kind)
    if known is None:
        known = _IS_NODE[kind] = issubclass(kind, cst.CSTNode)
    return known


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The syntactic children of a node, in source order, without whitespace nodes."""
    return iter(child_list(node))


def child_list(node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
    """`children` as a tuple, read from the fields once per node: libcst nodes are immutable,
    and the rules walk the same statements again and again (walks are most of their time)."""
    known = _CHILDREN.get(id(node))
    if known is not None and known[0] is node:
        return known[1]
    found = []
    for name in _FIELDS.get(type(node)) or _fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            for item in value:
                if _IS_NODE.get(type(item)) or _is_node(item):
                    found.append(item)
        elif _IS_NODE.get(kind) or _is_node(value):
            found.append(value)
    kids = tuple(found)
    if len(_CHILDREN) < _MAX_REMEMBERED:
        _CHILDREN[id(node)] = (node, kids)  # the node kept alive: its id is not reused
    return kids


# Children by node id, for the module being analysed (`forget_children` between modules). The
# bound keeps a big module's memory in check (about 150 bytes an entry); past it, children are
# read from the fields again.
_CHILDREN: dict[int, tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = {}
_MAX_REMEMBERED = 1 << 18


def forget_children() -> None:
    """Drop the remembered children (and the trees they keep alive): a new module is analysed."""
    _CHILDREN.clear()


def walk(node: cst.CSTNode, into_scopes: bool = False) -> Iterator[cst.CSTNode]:
    """Pre-order walk in source order; nested defs, classes and lambdas only when asked."""
    stack = [node]
    pop, extend = stack.pop, stack.extend
    while stack:
        current = pop()
        yield current
        if current is not node and not into_scopes and type(current) in SCOPES:
            continue
        extend(reversed(child_list(current)))


SCOPES = frozenset((cst.FunctionDef, cst.ClassDef, cst.Lambda))  # nodes with names of their own


def compound_statements(node: cst.CSTNode) -> Iterator[cst.BaseCompoundStatement]:
    """Every compound statement (def, class, if, loop, with, try, match) in `node`, nested
    scopes included, in the order `walk(node, into_scopes=True)` meets them. Statements never
    sit in expressions or simple statement lines, so only the blocks are entered: a statement
    table costs the statements, not every node of the module."""
    stack = [node]
    while stack:
        current = stack.pop()
        if _kind_of(type(current)) is _COMPOUND:
            yield current
        kids = [k for k in child_list(current) if _kind_of(type(k)) is not None]
        kids.reverse()
        stack.extend(kids)


# What a compound statement may hold below it (an `elif` is an If in `orelse`).
_HOLDS_STATEMENTS = (
    cst.BaseCompoundStatement,
    cst.BaseSuite,
    cst.Else,
    cst.Finally,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.MatchCase,
)


class _Holder(enum.Enum):
    """What a node type is to the statement walk."""

    COMPOUND = enum.auto()  # a compound statement (it holds statements too)
    OTHER = enum.auto()  # a suite, else, finally, handler or match case


_COMPOUND = _Holder.COMPOUND
_KINDS: dict[type, _Holder | None] = {}


def _kind_of(node_type: type) -> _Holder | None:
    """Whether a node type is a compound statement, another statement holder, or neither,
    answered once per type (`isinstance` on libcst's abstract classes is slow)."""
    try:
        return _KINDS[node_type]
    except KeyError:
        pass
    if issubclass(node_type, cst.BaseCompoundStatement):
        kind = _COMPOUND
    elif issubclass(node_type, _HOLDS_STATEMENTS):
        kind = _Holder.OTHER
    else:
        kind = None
    _KINDS[node_type] = kind
    return kind


def dotted(node: cst.CSTNode | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    kind = type(node)
    if kind is _NAME:  # most calls: a plain name
        return node.value
    parts: list[str] = []
    while kind is _ATTRIBUTE:
        parts.append(node.attr.value)
        node = node.value
        kind = type(node)
    if kind is _NAME:
        parts.append(node.value)
        parts.reverse()
        return ".".join(parts)
    return None


# Exact types: the parser builds no subclasses of these (isinstance on libcst's ABCs is slow).
_NAME, _ATTRIBUTE = cst.Name, cst.Attribute


def last_part(text: str | None) -> str:
    return text.rsplit(".", 1)[-1] if text else ""


def strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` without its own parentheses; `()` keeps them (they are the empty tuple)."""
    if isinstance(node, cst.Tuple) and not node.elements:
        return node
    if getattr(node, "lpar", None):
        return node.with_changes(lpar=[], rpar=[])
    return node


_EMPTY = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    """Source text of a node (exact for expressions, which own their parentheses)."""
    text = dotted(node)
    if text is not None and not getattr(node, "lpar", None):
        return text
    return _EMPTY.code_for_node(node)


def int_value(node: cst.CSTNode | None) -> int | None:
    if isinstance(node, cst.Integer):
        try:
            return int(node.value.replace("_", ""), 0)
        except ValueError:
            return None
    return None


def string_value(node: cst.CSTNode | None) -> str | None:
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value if isinstance(node.evaluated_value, str) else None
    return None


def is_false(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def has_star_kwargs(call: cst.Call) -> bool:
    return any(arg.star == "**" for arg in call.args)


def positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [arg.value for arg in call.args if arg.keyword is None and not arg.star]


def method_call(node: cst.CSTNode) -> tuple[cst.BaseExpression, str] | None:
    """For `recv.name(...)` return (recv, name)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.value, node.func.attr.value
    return None
