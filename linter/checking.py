"""Analyse, and with `fix` fix, one module's text: the core under `text.lint_text`, the runner
and notebooks' programs, so there is one analysis-and-fix path, not two.

It imports neither `text` nor `notebooks` (both build on it).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from linter.reporting import file_error, syntax_error
from linter.types import Diagnostic

if TYPE_CHECKING:
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
