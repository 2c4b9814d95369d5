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
    afterwards, later collections skip them too. The methods `dataclasses` writes for the ~200
    node classes come compiled from `_DataclassCode` (half of libcst's import was compiling them).
    The checks are imported by `analyze_source`, those selected only.
    """
    with _importing():
        import libcst  # noqa: F401

        import linter.context  # noqa: F401
        import rules  # noqa: F401
    gc.freeze()


@cache
def _dataclass_code() -> _DataclassCode:
    return _DataclassCode(stored=_store_code)


_store_code = True


def store_no_code() -> None:
    """`--no-cache`: the dataclass code is compiled afresh and nothing is read from or written
    to the user's cache directory (about 0.15 s of CPU more per run). Call before the first lint."""
    global _store_code
    _store_code = False


@contextmanager
def _importing():
    """Imports of libcst, the model and the checks: collector paused, dataclass code reused."""
    enabled = gc.isenabled()
    gc.disable()
    code = _dataclass_code()
    try:
        with code.installed():
            yield
    finally:
        if enabled:
            gc.enable()
    code.save()


def _checks(codes: Collection[str]) -> list:
    """The static checks of the selected codes, each module imported on first use only."""
    from linter.checks import check_for
    from rules import ALL_RULES, module_name

    # A code has a check exactly when its record says `static` (test_checks_registry.py), so
    # the records (docs and all) are not imported for this.
    selected = [c for c in sorted(codes) if c in ALL_RULES]
    with _importing():
        checks = [(c, check_for(module_name(c))) for c in selected]
    return [(c, check) for c, check in checks if check is not None]


class _DataclassCode:
    """The code objects of the methods `dataclasses` generates, kept between runs like `.pyc`s.

    `dataclasses` builds each `__init__`/`__eq__`/`__repr__`/... as source text and `exec`s it;
    compiling those texts is half of `import libcst`. While installed, `exec` in the
    `dataclasses` module compiles each text once and reuses the code object after that: keyed by
    the exact text, compiled as `exec` would (no inherited `__future__` flags), so the classes
    are the same. Saved in the user's cache directory for this interpreter (never with
    `--no-cache`); any failure to read or write it only costs the time."""

    def __init__(self, stored: bool = True) -> None:
        import marshal
        import os
        import sys

        tag = f"{sys.implementation.cache_tag}-O{sys.flags.optimize}"
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        self.path = os.path.join(base, "accel-lint", f"dataclass-code-{tag}.marshal")
        self.header = (sys.version, sys.flags.optimize)
        self.known: dict[str, object] = {}
        self.used: dict[str, object] = {}
        self.stored = stored
        if not stored:
            return
        try:
            with open(self.path, "rb") as file:
                header, known = marshal.loads(file.read())
            if header == self.header and isinstance(known, dict):
                self.known = known
        except Exception:  # absent, unreadable, truncated, another format: compile
            pass

    def exec(self, source, globals=None, locals=None):  # the builtin's signature
        if globals is None:  # as the builtin: the calling frame's namespaces
            import sys

            frame = sys._getframe(1)
            globals, locals = frame.f_globals, frame.f_locals if locals is None else locals
        if not isinstance(source, str):
            return exec(source, globals, locals)
        code = self.known.get(source)
        if code is None:
            code = compile(source, "<string>", "exec", dont_inherit=True)
        self.used[source] = code
        return exec(code, globals, locals)

    @contextmanager
    def installed(self):
        import dataclasses

        dataclasses.exec = self.exec  # found before the builtin by the module's own lookups
        try:
            yield
        finally:
            del dataclasses.exec

    def save(self) -> None:
        """Add the texts this run compiled. Texts of other versions are kept (another entry
        point, another install) until they outnumber this run's twice over."""
        if not self.stored or not self.used.keys() - self.known.keys():
            return
        kept = {**self.known, **self.used}
        if len(kept) > 3 * len(self.used):
            kept = self.used
        import marshal
        import os

        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(temporary, "wb") as file:
                file.write(marshal.dumps((self.header, kept)))
            os.replace(temporary, self.path)  # concurrent runs: one whole file wins
        except OSError:
            try:
                os.remove(temporary)
            except OSError:
                pass


def parse(source: str, cache: ParseCache | None = None):
    """Parse with libcst; a syntax error becomes a `ParseFailure` with its position.

    With a cache (the language server's), only the top-level statements that changed since the
    versions it saw are parsed again, cut where Python's `ast` says they start. Returns the
    libcst module and that `ast` (positions reuse it; None when `ast` rejects the text, or when
    neither the screen nor a cache or a big file needed it)."""
    import libcst as cst

    from linter.incremental import ast_of, parse_in_pieces, parse_with
    from linter.screen import screened

    big = cache is None and len(source) >= PIECES_FROM
    tree = screened(source)  # the screen's, when it just read this text
    if tree is None and (cache is not None or big):
        tree = ast_of(source)
    try:
        if big and tree is not None:
            return parse_in_pieces(source, tree), tree
        module = parse_with(cache, source, tree)
    except cst.ParserSyntaxError as error:
        raise ParseFailure(error.message, error.raw_line, error.raw_column) from None
    return module, tree


def _prepared(source: str, cache: ParseCache | None = None):
    """What the model reads: the module, its `ast`, its text and, for a big module, the
    `linter.reduce.Reduction` that text is (only the statements a rule can reach; None for a
    module analysed whole). Raises `ParseFailure`, or `Unanalysable` for a scan (the language
    server's, which the screen left to the analysis) that finds the module too deep."""
    from linter import reduce, screen

    if len(source) >= screen.SCAN_FROM:
        found = reduce.scanned(source)
        if found is None:
            found = reduce.scan(source, screen.nesting_depth, screen.parser_limit)
            problem = screen.scanned_problem(found) if found is not None else None
            if problem is not None:
                raise screen.Unanalysable(*problem)
        reduction = reduce.reduce(source, found.statements) if found is not None else None
        del found
        if reduction is not None:
            module, tree = parse(reduction.text, cache)
            return module, tree, reduction.text, reduction
    module, tree = parse(source, cache)
    return module, tree, source, None


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
    """Run every selected rule that has a static check on one module's source text.

    Inside a project (`linter.project.enable`) the model also reads what the file uses from
    the project's other modules; only the file's own findings are returned."""
    load()
    context = _project_context(source, path)
    if context is not None:  # the language server's parse cache keeps the context's pieces too
        try:
            found = _analyze(context.text, path, codes, cache)
        except ParseFailure as failure:
            if failure.line <= context.base:
                raise
            found = None  # the context does not parse with the file: the file alone
        if found is not None:
            return _own_findings(found, context)
    return _analyze(source, path, codes, cache)


def _project_context(source: str, path: str):
    from linter import project

    current = project.current()
    if current is None:
        return None
    import os

    return current.context(os.path.abspath(path), source)


def _own_findings(found: list[Diagnostic], context) -> list[Diagnostic]:
    """The findings in the file itself, in its words; a fix reaching into the context (which
    belongs to another module) is withheld, the finding kept."""
    from dataclasses import replace

    from linter.types import Edit, Fix

    kept, placed = [], set()
    for d in found:
        if d.start.line > context.base:
            moved = _reached_from_the_file(d, context)
            if moved is not None and (moved.code, moved.start) not in placed:
                placed.add((moved.code, moved.start))
                kept.append(moved)
            continue
        fix = d.fix
        if fix is not None:
            if any(e.end.line > context.base for e in fix.edits):
                fix = None
            else:
                edits = tuple(Edit(e.start, e.end, context.names(e.content)) for e in fix.edits)
                fix = Fix(fix.applicability, context.words(fix.message), edits)
        notes = tuple(context.words(n) for n in d.notes)
        kept.append(replace(d, message=context.words(d.message), fix=fix, notes=notes))
    return kept


# Findings about how an API is written, not about the step: the other module's own run says them.
_WHERE_WRITTEN = frozenset({"ACL000", "ACL203"})


def _reached_from_the_file(d: Diagnostic, context) -> Diagnostic | None:
    """A finding inside a definition the file imports (its loss function, its step helper)
    exists because of the file's loop: it is reported where the file uses the definition, and
    says where the code to change is. A finding in another module's caller of the file, or in
    an imported function with a loop of its own (an imported `train_one_epoch`), is found when
    that module is linted: it is never this file's too."""
    from dataclasses import replace

    from linter.types import Position

    origin = context.origin(d.start.line)
    if origin is None or origin.caller or origin.loop or d.code in _WHERE_WRITTEN:
        return None
    use = context.use_of(origin.name)
    if use is None:
        return None
    line, start, end = use
    path, other = context.locate(d.start.line)
    message = f"{context.words(d.message)} (in {path}:{other}; the change belongs there)"
    notes = tuple(context.words(n) for n in d.notes)
    return replace(
        d, message=message, start=Position(line, start), end=Position(line, end), fix=None,
        notes=notes,
    )  # fmt: skip


def _analyze(
    source: str, path: str, codes: Collection[str], cache: ParseCache | None
) -> list[Diagnostic]:
    from linter.context import RuleContext
    from linter.model import Model

    checks = _checks(codes)
    with _collector_paused():
        module, tree, text, reduction = _prepared(source, cache)
        if not checks:
            return []
        model = Model(module, text, tree, path)
        diagnostics: list[Diagnostic] = []
        for code, check in checks:
            ctx = RuleContext(model, text, path, code)
            check(ctx)
            diagnostics.extend(ctx.diagnostics)
    if reduction is not None:  # fixes that would touch the dropped code are withheld
        diagnostics = reduction.checked(diagnostics)
    diagnostics.sort(key=lambda d: (d.start, d.code))
    return diagnostics


def describe_loops(source: str, path: str) -> dict:
    """What the linter understood about each training loop (for `--show-loops`)."""
    load()
    context = _project_context(source, path)
    if context is not None:
        try:
            with _collector_paused():
                described = _described(context.text, path)
        except ParseFailure:
            described = None
        if described is not None:
            from linter.project.describe import placed

            return placed(described, context)
    with _collector_paused():
        return _described(source, path)


def _described(source: str, path: str) -> dict:
    from linter.model import Model
    from linter.model.describe import describe

    module, tree, text, reduction = _prepared(source)
    described = describe(Model(module, text, tree, path), path)
    if reduction is not None:  # what the description did not look at, said once
        described["skipped_unrelated_statements"] = reduction.skipped
    return described
