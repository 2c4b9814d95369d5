"""Parse a module again after an edit by re-parsing only the top-level statements that changed.

An editor sends the whole text on every keystroke, and libcst's parse of a 500-line script
(about 50 ms) is half of the language server's answer. Most top-level statements are unchanged
between two versions, and a libcst node describes its text without positions, so a statement
parsed once can be reused in the next version's tree.

Python's `ast` (a C parser, ~6 ms for 500 lines, and needed for positions anyway) gives where
each top-level statement starts. The text is cut into chunks at those lines; each chunk is one
top-level statement, its decorators, and the lines after it up to the next statement. Parsed
alone, a chunk gives the statement with exactly the tokens and whitespace libcst gives it in the
whole file, except for the lines after it: in the whole file those that are not indented into
the statement's last block lead the next statement (`leading_lines`), while a chunk parsed alone
holds them in its module footer. They are moved back, so the assembled tree equals the
whole-file parse node for node (`deep_equals`; tested over real files and random edits).

Chunk texts are cached (a bounded LRU); a chunk whose nodes already sit elsewhere in the tree
being assembled is parsed afresh, because the model keys its facts by node identity.

The whole-file screen (`linter.screen`: CPython's nesting limits, and the depth libcst must not
be given) costs ~20 ms on 500 lines, as much as the rest of an answer, so here it is applied
from the same `ast` to the chunks not seen before: a module is as deep as its deepest
top-level statement.
"""

from __future__ import annotations

import ast
import re
from collections import OrderedDict
from dataclasses import dataclass

import libcst as cst

from linter.model.cst_util import walk
from linter.screen import GIVES_UP, Unanalysable, parser_limit, too_deep

# Lines as Python's tokenizer counts them (str.splitlines also splits at form feeds and others).
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass(frozen=True)
class _Chunk:
    module: cst.Module  # the chunk parsed alone: its body, header and footer
    indented: bool  # whether it holds an indented block (then libcst read its indentation)


class ParseCache:
    """Parses successive versions of documents, reusing unchanged top-level statements."""

    def __init__(self, max_chunks: int = 4096) -> None:
        self._chunks: OrderedDict[str, _Chunk] = OrderedDict()
        self._max = max_chunks

    def parse(self, source: str, tree: ast.Module) -> cst.Module:
        """The libcst module of `source`, whose `ast` parse is `tree`.

        Raises libcst's ParserSyntaxError like `cst.parse_module` for text libcst rejects."""
        lines = _LINES.findall(source)
        groups = _statement_groups(tree)
        if not groups:
            return cst.parse_module(source)
        starts = [start for start, _ in groups]
        texts = _chunk_texts(lines, starts)
        for text, (_, nodes) in zip(texts, groups, strict=True):
            if text not in self._chunks:  # all before any parse: a fallback parses them all
                _screen(nodes)
        used: set[int] = set()
        chunks = [self._chunk(text, used) for text in texts]
        return _assemble(chunks, source)

    def _chunk(self, text: str, used: set[int]) -> _Chunk:
        chunk = self._chunks.get(text)
        if chunk is not None and id(chunk.module.body[0]) not in used:
            self._chunks.move_to_end(text)
        else:
            fresh = chunk is None
            chunk = _parse_chunk(text)
            if fresh:
                self._remember(text, chunk)
        used.add(id(chunk.module.body[0]))
        return chunk

    def _remember(self, text: str, chunk: _Chunk) -> None:
        self._chunks[text] = chunk
        while len(self._chunks) > self._max:
            self._chunks.popitem(last=False)


def _statement_groups(tree: ast.Module) -> list[tuple[int, list[ast.stmt]]]:
    """The top-level statements by the source line that starts them (0-based; `a = 1; b = 2` is
    one libcst statement line), decorators included."""
    groups: list[tuple[int, list[ast.stmt]]] = []
    last_end = 0
    for node in tree.body:
        decorators = getattr(node, "decorator_list", ())
        first = min([node.lineno] + [d.lineno for d in decorators])
        if first > last_end or not groups:
            groups.append((first - 1, []))
        groups[-1][1].append(node)
        last_end = max(last_end, node.end_lineno or node.lineno)
    return groups


def _screen(nodes: list[ast.stmt]) -> None:
    """The whole-file screen's depth limit, applied to the statements about to be parsed: the
    module's depth is its deepest top-level statement's (see `linter.screen`)."""
    problem = too_deep(ast.Module(body=nodes, type_ignores=[]))
    if problem is not None:
        raise Unanalysable(*problem)


def _chunk_texts(lines: list[str], starts: list[int]) -> list[str]:
    """The text from each start to the next (the first chunk also holds the module header)."""
    bounds = [0, *starts[1:], len(lines)]
    return ["".join(lines[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


def _parse_chunk(text: str) -> _Chunk:
    module = cst.parse_module(text)
    if len(module.body) != 1 or module.code != text:
        raise _NotOneStatement  # libcst loses a blank line before an indented comment at EOF
    indented = any(isinstance(node, cst.IndentedBlock) for node in walk(module, True))
    return _Chunk(module, indented)


class _NotOneStatement(Exception):
    """A chunk that libcst reads as other than one statement, or does not print back."""


class _Unshareable(Exception):
    """Chunks that leave whitespace to module defaults that differ from the file's."""


def _same_defaults(chunk: _Chunk, indent: str, newline: str) -> bool:
    """Whether the chunk's nodes print the same inside the assembled module.

    libcst stores the file's usual indentation and line ending as "the module's default"
    (None): a chunk of a file that mixes indentations or line endings read other defaults."""
    module = chunk.module
    if chunk.indented and module.default_indent != indent:
        return False
    return not module.has_trailing_newline or module.default_newline == newline


def _assemble(chunks: list[_Chunk], source: str) -> cst.Module:
    body: list[cst.BaseStatement] = []
    carried: tuple[cst.EmptyLine, ...] = ()
    for chunk in chunks:
        statement, *rest = chunk.module.body
        if carried:
            statement = statement.with_changes(leading_lines=(*carried, *statement.leading_lines))
        body.append(statement)
        body.extend(rest)
        carried = tuple(chunk.module.footer)
    first, last = chunks[0].module, chunks[-1].module
    indent = next((c.module.default_indent for c in chunks if c.indented), first.default_indent)
    if not all(_same_defaults(c, indent, first.default_newline) for c in chunks):
        raise _Unshareable
    return cst.Module(
        body=body,
        header=first.header,
        footer=last.footer,
        encoding=first.encoding,
        default_indent=indent,
        default_newline=first.default_newline,
        has_trailing_newline=last.has_trailing_newline,
    )


def parse_in_pieces(source: str, tree: ast.Module, piece_bytes: int = 64 * 1024) -> cst.Module:
    """The libcst module of a big `source`, parsed a run of top-level statements at a time.

    libcst's native parser holds the tokens and its own tree of all the text it is given until
    it has built the Python nodes: about 400 bytes per byte of source, ten times the tree it
    returns. Given pieces of `piece_bytes`, it holds one piece's; the assembled tree equals the
    whole parse (as for the cache's chunks), and a cut libcst disagrees with falls back to it."""
    lines = _LINES.findall(source)
    groups = _statement_groups(tree)
    if not groups:
        return cst.parse_module(source)
    texts = _chunk_texts(lines, [start for start, _ in groups])
    pieces: list[list[int]] = []  # indices into texts and groups
    size = piece_bytes
    for index, text in enumerate(texts):
        if size >= piece_bytes or len(text) > piece_bytes:
            pieces.append([])
            size = 0
        pieces[-1].append(index)
        size += len(text)
    try:
        chunks = []
        for piece in pieces:
            text = "".join(texts[i] for i in piece)
            nodes = groups[piece[0]][1]
            if len(text) > piece_bytes and len(piece) == 1 and len(nodes) == 1:
                try:
                    start = groups[piece[0]][0]
                    chunks.append(_parse_definition(text, nodes[0], start, piece_bytes))
                except (_NotOneStatement, cst.ParserSyntaxError):
                    chunks.append(_parse_piece(text, 1))  # this definition parsed whole
            else:
                chunks.append(_parse_piece(text, len(piece)))
        return _assemble(chunks, source)
    except (_NotOneStatement, _Unshareable, cst.ParserSyntaxError):
        return cst.parse_module(source)


# Stand-ins that hold a piece of a definition's body, parsed at the body's own indentation.
_STAND_INS = {
    ast.FunctionDef: "def _():\n",
    ast.AsyncFunctionDef: "async def _():\n",
    ast.ClassDef: "class _:\n",
}


def _parse_definition(text: str, node: ast.stmt, start: int, piece_bytes: int) -> _Chunk:
    """A top-level `def` or `class` bigger than a piece (one generated function of thousands of
    statements): its header with its first body statements, then the rest of its body a piece
    at a time, each parsed inside a stand-in definition of the same kind at column 0, so that
    the statements keep their columns. Lines between two pieces lead the next statement, as in
    the whole parse; a piece that ends otherwise (the stand-in's own footer) is not cut there."""
    stand_in = _STAND_INS.get(type(node))
    body = getattr(node, "body", [])
    if stand_in is None or node.col_offset != 0 or len(body) < 2:
        return _parse_piece(text, 1)
    lines = _LINES.findall(text)
    starts = []
    for child in body:
        decorators = getattr(child, "decorator_list", ())
        first = min([child.lineno] + [d.lineno for d in decorators]) - 1 - start
        if not starts or first >= starts[-1][1]:
            starts.append((first, (child.end_lineno or child.lineno) - start))
        else:
            starts[-1] = (starts[-1][0], max(starts[-1][1], (child.end_lineno or 0) - start))
    cuts = [0]  # line indices where a piece starts; the first holds the header
    size = 0
    for (first, end), (following, _) in zip(starts, starts[1:], strict=False):
        size += sum(len(line) for line in lines[first:following])
        # Only where no line comes between: libcst reads a blank or comment line at the end of
        # a piece relative to the stand-in's column, not as the next statement's leading line.
        if size >= piece_bytes and end == following:
            cuts.append(following)
            size = 0
    if len(cuts) == 1:
        return _parse_piece(text, 1)
    texts = ["".join(lines[a:b]) for a, b in zip(cuts, [*cuts[1:], len(lines)], strict=True)]
    head = cst.parse_module(texts[0])
    definition = head.body[0] if len(head.body) == 1 else None
    if not isinstance(definition, (cst.FunctionDef, cst.ClassDef)) or head.footer:
        raise _NotOneStatement
    block = definition.body
    if not isinstance(block, cst.IndentedBlock) or block.footer:
        raise _NotOneStatement
    statements = list(block.body)
    for index, piece in enumerate(texts[1:], start=2):
        module = cst.parse_module(stand_in + piece)
        inner = module.body[0].body if len(module.body) == 1 else None
        if not isinstance(inner, cst.IndentedBlock) or inner.indent != block.indent:
            raise _NotOneStatement
        if module.default_indent != head.default_indent:
            raise _NotOneStatement
        if index < len(texts) and (inner.footer or module.footer):
            raise _NotOneStatement
        statements += inner.body
        tail = module.with_changes(
            body=[module.body[0].with_changes(body=inner.with_changes(body=inner.body[-1:]))]
        ).code
        if not (stand_in + piece).endswith(tail[len(stand_in) :]) or not tail.startswith(stand_in):
            raise _NotOneStatement
    definition = definition.with_changes(
        body=block.with_changes(body=statements, footer=inner.footer)
    )
    whole = head.with_changes(body=[definition], footer=module.footer)
    return _Chunk(whole, True)


# A line indented into a block (or a continuation line: then the piece is only judged by the
# file's indentation too, and a mismatch falls back to the whole parse).
_INDENTED = re.compile(r"^[ \t]+\S", re.M)


def _parse_piece(text: str, statements: int) -> _Chunk:
    """One piece parsed alone; only its end can differ from the whole parse (the end of the
    file there), so that is what is printed back and compared, not the whole piece."""
    module = cst.parse_module(text)
    if len(module.body) != statements:
        raise _NotOneStatement
    if not text.endswith(module.with_changes(header=(), body=module.body[-1:]).code):
        raise _NotOneStatement
    return _Chunk(module, bool(_INDENTED.search(text)))


def ast_of(source: str) -> ast.Module | None:
    """Python's `ast` of the text, None for text it rejects (libcst then words the error).

    Raises `Unanalysable` where CPython gives up for nesting: libcst must not see that text."""
    try:
        return ast.parse(source)
    except SyntaxError as error:
        problem = parser_limit(error)
        if problem is not None:
            raise Unanalysable(*problem) from None
        return None
    except ValueError:
        return None
    except (RecursionError, MemoryError):
        raise Unanalysable(GIVES_UP) from None


def parse_with(cache: ParseCache | None, source: str, tree: ast.Module | None) -> cst.Module:
    """Through the cache when there is one and `ast` read the text; a cut libcst disagrees with
    falls back to a whole parse, so the result is always the whole file's tree."""
    if cache is None or tree is None:
        return cst.parse_module(source)
    try:
        return cache.parse(source, tree)
    except (_NotOneStatement, _Unshareable, cst.ParserSyntaxError):
        return cst.parse_module(source)
