"""Entry point from the driver into the static analysis: parse, build the model, run rules.

The interface (owned here, used by the runner/CLI):
- `analyze_source(source, path, codes, cache=None) -> list[Diagnostic]` (raises `ParseFailure`)
- `describe_loops(source, path) -> dict` (the JSON form of `--show-loops`)
"""

from __future__ import annotations

import gc
from collections.abc import Collection
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING

from linter.types import Diagnostic

if TYPE_CHECKING:
    from linter.incremental import ParseCache


class ParseFailure(Exception):
    """The file is not valid Python: reported as ACL000 with a line and column."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


@cache
def load() -> None:
    """Import libcst, the model and the rules once, with the cyclic garbage collector paused.

    These imports create a few hundred thousand long-lived objects (libcst's node classes); the
    collector would scan them again and again for nothing, about 15 ms of a one-file run. Frozen
    afterwards, later collections skip them too.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        import libcst  # noqa: F401

        import linter.context  # noqa: F401
        import rules  # noqa: F401
    finally:
        if enabled:
            gc.enable()
    gc.freeze()


def parse(source: str, cache: ParseCache | None = None):
    """Parse with libcst; a syntax error becomes a `ParseFailure` with its position.

    With a cache (the language server's), only the top-level statements that changed since the
    versions it saw are parsed again, cut where Python's `ast` says they start. Returns the
    libcst module and that `ast` (positions reuse it; None without a cache, or when `ast`
    rejects the text)."""
    import libcst as cst

    from linter.incremental import ast_of, parse_in_pieces, parse_with

    big = cache is None and len(source) >= PIECES_FROM
    tree = ast_of(source) if cache is not None or big else None
    try:
        if big and tree is not None:
            return parse_in_pieces(source, tree), tree
        module = parse_with(cache, source, tree)
    except cst.ParserSyntaxError as error:
        raise ParseFailure(error.message, error.raw_line, error.raw_column) from None
    return module, tree


# From this size (characters) a module is parsed in pieces (`parse_in_pieces`): libcst's parser
# of the whole text would need ten times the memory of the tree it returns.
PIECES_FROM = 128 * 1024


@contextmanager
def _collector_paused():
    """The cyclic garbage collector off while one module is parsed and analysed.

    The tree and the model's facts are hundreds of thousands of objects that live until the end,
    with no cycles among them to collect; each collection that the allocations trigger would
    walk them all again (a third of the time on a big file). Garbage cycles made meanwhile are
    collected once it is back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def analyze_source(
    source: str, path: str, codes: Collection[str], cache: ParseCache | None = None
) -> list[Diagnostic]:
    """Run every selected rule that has a static check on one module's source text."""
    load()
    from linter.checks import check_for
    from linter.context import RuleContext
    from linter.model import Model
    from rules import ALL_RULES, module_name

    selected = [c for c in sorted(codes) if c in ALL_RULES and ALL_RULES[c].static]
    checks = [(c, check_for(module_name(c))) for c in selected]
    checks = [(c, check) for c, check in checks if check is not None]
    with _collector_paused():
        module, tree = parse(source, cache)
        if not checks:
            return []
        model = Model(module, source, tree)
        diagnostics: list[Diagnostic] = []
        for code, check in checks:
            ctx = RuleContext(model, source, path, code)
            check(ctx)
            diagnostics.extend(ctx.diagnostics)
    diagnostics.sort(key=lambda d: (d.start, d.code))
    return diagnostics


def describe_loops(source: str, path: str) -> dict:
    """What the linter understood about each training loop (for `--show-loops`)."""
    load()
    from linter.model import Model
    from linter.model.describe import describe

    with _collector_paused():
        module, tree = parse(source)
        return describe(Model(module, source, tree), path)
