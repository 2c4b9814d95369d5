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
    pieces: list[list[str]] = []
    size = piece_bytes
    for text in texts:
        if size >= piece_bytes:
            pieces.append([])
            size = 0
        pieces[-1].append(text)
        size += len(text)
    try:
        chunks = [_parse_piece("".join(piece), len(piece)) for piece in pieces]
        return _assemble(chunks, source)
    except (_NotOneStatement, _Unshareable, cst.ParserSyntaxError):
        return cst.parse_module(source)


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
