"""Lint one source text held in memory: what stdin, the language server and the runner share.

`lint_text` resolves the config for the path the text claims to be (a file need not exist there),
analyses, applies `# noqa`, and with `fix` returns the fixed text. `check_source` is the core the
runner calls for every file it reads, so there is one analysis-and-fix path, not two.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from linter.types import Diagnostic

if TYPE_CHECKING:
    from linter.config import Resolver
    from linter.incremental import ParseCache
    from linter.notebooks import CellIndex

FixChoice = Literal["none", "safe", "unsafe"]
_FIRST_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclass
class TextResult:
    diagnostics: list[Diagnostic]  # what remains (after the fixes when `fix` was asked for)
    fixed: str | None = None  # the fixed text when fix != "none" (equal to the input if no fix)
    fixes_applied: int = 0
    error: str | None = None  # a fix that produced invalid syntax (the text was kept)
    # A notebook's positions are in its program (all code cells); this maps them to cells.
    cells: CellIndex | None = field(default=None, compare=False)


def lint_text(
    source: str,
    path: str | Path,
    resolver: Resolver,
    fix: FixChoice = "none",
    cache: ParseCache | None = None,
) -> TextResult:
    """Lint `source` as the file at `path` would be linted (its config, its per-file-ignores).

    A `.ipynb` path means `source` is the notebook's JSON; `fixed` is then the notebook's JSON.
    `cache` (an editor's successive versions) re-parses only the statements that changed."""
    from linter.runner import shown_path

    path = Path(path)
    settings = resolver.for_path(path)
    codes, hints = settings.codes_for(path), settings.hints
    if path.suffix == ".ipynb":
        from linter.notebooks import lint_notebook_text

        return lint_notebook_text(source, shown_path(path), codes, fix, hints)
    shown = shown_path(path)
    screened = screen_text(source, shown, fix, cache)
    if screened is not None:
        return screened
    return check_source(source, shown, codes, fix, newline_of(source), cache, hints)


def screen_text(
    source: str, shown: str, fix: FixChoice = "none", cache: ParseCache | None = None
) -> TextResult | None:
    """The runner's screen (too large, too deep) before libcst sees the text: the one ACL000
    it gives, or None to analyse.

    With a cache only the size is judged here: the depth is judged there, chunk by chunk (the
    whole screen costs as much as the rest of an editor's answer)."""
    from linter import screen

    size = len(source.encode("utf-8", "surrogatepass"))
    if size <= screen.MAX_BYTES and cache is not None:
        return None
    problem = screen.unanalysable(source, size, shown)
    if problem is None:
        return None
    return _unanalysable(source, shown, fix, *problem)


def _unanalysable(text: str, shown: str, fix: FixChoice, message: str, line: int = 1):
    from linter.runner import file_error

    return TextResult([file_error(shown, message, line)], text if fix != "none" else None)


def newline_of(text: str) -> str:
    """The first line ending of `text` ("\\n" when it has none): fixes insert this one."""
    match = _FIRST_NEWLINE.search(text)
    return match.group() if match else "\n"


def analyse(
    text: str,
    shown: str,
    codes: Collection[str],
    cache: ParseCache | None = None,
    hints: bool = False,
) -> list[Diagnostic]:
    """The findings of `codes` in `text` that no `# noqa` suppresses; raises ParseFailure.

    Hints (info-level findings) are dropped here unless asked for: off by default, they are
    never shown, fixed, cached as findings or counted."""
    from linter import analysis, noqa

    found = analysis.analyze_source(text, shown, codes, cache)
    kept = [d for d in found if d.code in codes and (hints or not d.is_hint)]
    return noqa.apply(text, kept)


def check_source(
    text: str,
    shown: str,
    codes: Collection[str],
    fix: FixChoice = "none",
    newline: str = "\n",
    cache: ParseCache | None = None,
    hints: bool = False,
) -> TextResult:
    """Analyse (and with `fix`, fix) one module's text; a syntax error becomes one ACL000.

    Other exceptions (a bug in a rule) propagate: the caller decides how to report them."""
    from linter.analysis import ParseFailure
    from linter.screen import Unanalysable

    try:
        diagnostics = analyse(text, shown, codes, cache, hints)
    except Unanalysable as problem:  # found by the parse cache's screen
        return _unanalysable(text, shown, fix, problem.message, problem.line)
    except ParseFailure as failure:
        from linter.runner import syntax_error

        return TextResult([syntax_error(text, shown, failure)], text if fix != "none" else None)
    if fix == "none":
        return TextResult(diagnostics)
    from linter import fixer

    unsafe = fix == "unsafe"
    if not any(fixer.applicable(d, unsafe) for d in diagnostics):
        return TextResult(diagnostics, text)

    def again(new_text: str) -> list[Diagnostic]:
        return analyse(new_text, shown, codes, hints=hints)

    outcome = fixer.fix_text(text, again, unsafe, newline, diagnostics)
    return TextResult(outcome.diagnostics, outcome.text, outcome.fixed, outcome.error)
