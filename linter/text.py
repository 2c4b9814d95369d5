"""Lint one source text held in memory: what stdin, the language server and the runner share.

`lint_text` resolves the config for the path the text claims to be (a file need not exist there),
analyses, applies `# noqa`, and with `fix` returns the fixed text. `check_source` (from
`linter.checking`) is the core the runner calls for every file it reads, so there is one
analysis-and-fix path, not two.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from linter.checking import FixChoice, TextResult, check_source, newline_of, screen_text
from linter.reporting import shown_path

if TYPE_CHECKING:
    from linter.config import Resolver
    from linter.incremental import ParseCache

__all__ = ["FixChoice", "TextResult", "check_source", "lint_text", "newline_of", "screen_text"]


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
