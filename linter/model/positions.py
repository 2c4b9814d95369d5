"""Source positions, computed only for what is reported or described.

libcst's PositionProvider re-generates the whole module (about a second per 2,000 lines on a
big file), so positions are found in two cheap steps instead: Python's `ast` (a C parser) gives
the line and column of every statement, matched to libcst's statements by walking both trees in
step; libcst then positions a node inside its own statement by generating that statement alone.
If the two trees ever disagree, the whole-module provider is the fallback.
"""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from linter.model.cst_util import child_list

_PASS_BLOCK = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Pass()])])


class _Mismatch(Exception):
    """The ast and libcst statement lists do not line up."""


class _Headless(Exception):
    """`try:` / `match x:` headers: only their start is ever needed."""


class Positions:
    def __init__(
        self, module: cst.Module, source: str | None = None, tree: ast.Module | None = None
    ) -> None:
        self._module = module
        self._source = source
        self._tree = tree if source is not None else None  # `ast` of source, already parsed
        self._starts: dict[int, tuple[int, int]] | None = None  # id(stmt) -> (line, column)
        self._owner: dict[int, cst.CSTNode] = {}
        self._ranges: dict[int, CodeRange] = {}
        self._whole = None
        self._keep: list[cst.Module] = []
        self._elifs: set[int] = set()

    def line(self, node: cst.CSTNode) -> int:
        return self.range(node).start.line

    def statement_line(self, node: cst.CSTNode) -> int:
        """The line a statement starts on, read from the index without positioning anything
        inside it (a long `add_argument(...)` call is not generated again); other nodes as
        `line`."""
        if self._whole is None:
            try:
                if self._starts is None:
                    self._index()
                found = self._starts.get(id(node))
                if found is not None:
                    return found[0]
            except (_Mismatch, KeyError, SyntaxError, ValueError):
                pass
        return self.line(node)

    def range(self, node: cst.CSTNode) -> CodeRange:
        if self._whole is not None:
            return self._whole[node]
        try:
            if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                return CodeRange(self._local(node.body[0]).start, self._local(node.body[-1]).end)
            found = self._local(node)
            if isinstance(node, cst.BaseCompoundStatement):
                found = CodeRange(found.start, self._end(node))
            return found
        except (_Mismatch, KeyError, SyntaxError, ValueError):
            wrapper = MetadataWrapper(self._module, unsafe_skip_copy=True)
            self._whole = wrapper.resolve(PositionProvider)
            return self._whole[node]

    # positions inside one statement ---------------------------------------------------------
    def _local(self, node: cst.CSTNode) -> CodeRange:
        found = self._ranges.get(id(node))
        if found is not None:
            return found
        if self._starts is None:
            self._index()
        statement = node if id(node) in self._starts else self._owner[id(node)]
        line, column = self._starts[id(statement)]
        text = self._lines[line - 1]
        try:
            alone, anchor = _alone(statement, text[: len(text) - len(text.lstrip())])
        except _Headless:
            start = CodePosition(line, column)
            return CodeRange(start, start)
        self._keep.append(alone)  # ids below must not be reused by other temporary nodes
        ranges = MetadataWrapper(alone, unsafe_skip_copy=True).resolve(PositionProvider)
        origin = ranges[anchor].start
        for child, rel in ranges.items():
            if id(child) in self._ranges:
                continue
            # Alone, an `elif` prints as `if`: what follows the keyword sits two columns left.
            extra = 2 if id(statement) in self._elifs and child is not anchor else 0
            self._ranges[id(child)] = CodeRange(
                _shift(rel.start, origin, line, column + extra),
                _shift(rel.end, origin, line, column + extra),
            )
        if anchor is not statement:
            self._ranges[id(statement)] = self._ranges[id(anchor)]
        return self._ranges[id(node)]

    def _end(self, statement: cst.BaseCompoundStatement) -> CodePosition:
        """Where the last statement nested in a compound statement ends."""
        last = statement.cases[-1].body if isinstance(statement, cst.Match) else statement.body
        for part in ("handlers", "orelse", "finalbody"):
            value = getattr(statement, part, None)
            if isinstance(value, (list, tuple)) and value:
                last = value[-1].body
            elif value is not None and not isinstance(value, (list, tuple)):
                last = value if isinstance(value, cst.If) else value.body
        if isinstance(last, cst.BaseCompoundStatement):
            return self._end(last)
        final = last.body[-1] if isinstance(last, cst.IndentedBlock) else last
        return self.range(final).end

    def _index(self) -> None:
        source = self._source if self._source is not None else self._module.code
        self._lines = source.split("\n")
        tree = self._tree if self._tree is not None else ast.parse(source)
        self._starts = {}
        self._match(self._module.body, tree.body)

    # matching statements of both trees -----------------------------------------------------------
    def _match(self, statements, nodes: list[ast.stmt]) -> None:
        flat = []
        for statement in statements:
            if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                flat.extend(statement.body)
            else:
                flat.append(statement)
        if len(flat) != len(nodes):
            raise _Mismatch
        for statement, node in zip(flat, nodes, strict=True):
            self._starts[id(statement)] = (node.lineno, self._column(node))
            self._own(statement)
            self._children(statement, node)

    def _column(self, node: ast.stmt) -> int:
        text = self._lines[node.lineno - 1].encode("utf-8")
        return len(text[: node.col_offset].decode("utf-8"))

    def _own(self, statement: cst.CSTNode) -> None:
        """Record `statement` as the owner of every node in it that is not in a nested body.

        This visits every expression node of the module once, so it tests types through
        per-type tables (`isinstance` on libcst's abstract classes is the slow part)."""
        owner = self._owner
        stack = [c for c in child_list(statement) if not _is(c, _BODY_PARTS, _BODY_PART_TYPES)]
        while stack:
            current = stack.pop()
            owner[id(current)] = statement
            is_block = _BLOCK_TYPES.get(type(current))
            if is_block is None:
                is_block = _is(current, _BLOCKS, _BLOCK_TYPES)
            if not is_block:
                stack.extend(child_list(current))

    def _children(self, statement: cst.CSTNode, node: ast.stmt) -> None:
        if isinstance(statement, cst.If):
            self._match(_body(statement.body), node.body)
            if isinstance(statement.orelse, cst.If):
                self._elifs.add(id(statement.orelse))
                self._match([statement.orelse], node.orelse)
            elif statement.orelse is not None:
                self._match(_body(statement.orelse.body), node.orelse)
        elif isinstance(statement, (cst.For, cst.While)):
            self._match(_body(statement.body), node.body)
            if statement.orelse is not None:
                self._match(_body(statement.orelse.body), node.orelse)
        elif isinstance(statement, (cst.With, cst.FunctionDef, cst.ClassDef)):
            self._match(_body(statement.body), node.body)
        elif isinstance(statement, (cst.Try, cst.TryStar)):
            self._match(_body(statement.body), node.body)
            for handler, ast_handler in zip(statement.handlers, node.handlers, strict=True):
                self._match(_body(handler.body), ast_handler.body)
            if statement.orelse is not None:
                self._match(_body(statement.orelse.body), node.orelse)
            if statement.finalbody is not None:
                self._match(_body(statement.finalbody.body), node.finalbody)
        elif isinstance(statement, cst.Match):
            for case, ast_case in zip(statement.cases, node.cases, strict=True):
                self._match(_body(case.body), ast_case.body)


def _body(suite: cst.BaseSuite) -> list:
    return list(suite.body) if isinstance(suite, cst.IndentedBlock) else [suite]


# A statement's parts that hold nested statements (owned by those), and where owning stops.
_BODY_PARTS = (
    cst.BaseSuite,
    cst.Else,
    cst.Finally,
    cst.If,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.MatchCase,
)
_BLOCKS = (cst.BaseSuite, cst.BaseStatement)
_BODY_PART_TYPES: dict[type, bool] = {}
_BLOCK_TYPES: dict[type, bool] = {}


def _is(node: cst.CSTNode, kinds: tuple[type, ...], table: dict[type, bool]) -> bool:
    """`isinstance(node, kinds)`, remembered per node type in `table`."""
    known = table.get(type(node))
    if known is None:
        known = table[type(node)] = isinstance(node, kinds)
    return known


def _alone(statement: cst.CSTNode, indent: str) -> tuple[cst.Module, cst.CSTNode]:
    """A module holding just this statement (bodies emptied) at its own indentation.

    The indentation matters: continuation lines inside brackets are indented relative to the
    enclosing block, so only the same indentation reproduces their columns.
    """
    if isinstance(statement, cst.BaseSmallStatement):
        inner, anchor = cst.SimpleStatementLine(body=[statement]), statement
    else:
        changes = {"body": _PASS_BLOCK, "leading_lines": ()}
        if isinstance(statement, (cst.If, cst.For, cst.While)):
            changes["orelse"] = None
        if isinstance(statement, (cst.Try, cst.TryStar, cst.Match)):
            raise _Headless
        inner = anchor = statement.with_changes(**changes)
    if not indent:
        return cst.Module(body=[inner]), anchor
    block = cst.IndentedBlock(body=[inner], indent=indent)
    return cst.Module(body=[cst.If(test=cst.Name("_"), body=block)]), anchor


def _shift(position: CodePosition, origin: CodePosition, line: int, column: int) -> CodePosition:
    new_line = position.line - origin.line + line
    if position.line == origin.line:
        return CodePosition(new_line, position.column - origin.column + column)
    return CodePosition(new_line, position.column)
