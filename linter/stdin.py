"""`accel-lint --stdin-filename train.py -`: lint the source on standard input, as editors call it.

The config is the one resolved for the given path (the file need not exist). As in ruff: a check
prints the report on stdout; `--fix` prints the fixed source on stdout (unchanged when nothing
applies) and the findings that remain on stderr; `--diff` prints the diff on stdout.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from linter.config import Resolver
from linter.output.printer import Printer
from linter.reporting import shown_path, unified_diff
from linter.runner import FixMode
from linter.types import failing


class StdinError(Exception):
    """Standard input cannot be read as source (exit 2)."""


def run(filename: Path | None, resolver: Resolver, mode: FixMode, printer: Printer) -> int:
    """Lint stdin; returns the exit code (0 clean, 1 findings left, 2 error)."""
    from linter.text import lint_text

    path = filename or Path("-")
    data = sys.stdin.buffer.read()
    text, encode = _decoded(data, path)
    settings = resolver.for_path(path)
    fix = "none" if mode == "none" else "unsafe" if settings.unsafe_fixes else "safe"
    shown = shown_path(path)
    try:
        result = lint_text(text, path, resolver, fix)
    except Exception as exc:  # a bug in a rule: one error line, as for a file
        detail = "".join(traceback.format_exception_only(exc)).strip()
        print(f"error: {shown}: internal error: {detail}", file=sys.stderr)
        return 2
    final = result.fixed if result.fixed is not None else text
    if mode == "diff":
        sys.stdout.write(_diff(shown, text, final))
        if result.fixes_applied:
            printer.say(f"Would fix {_errors(result.fixes_applied)}.")
        return 1 if final != text else 0
    context = printer.context(settings.unsafe_fixes, result.diagnostics, texts={shown: final})
    if mode == "write":
        sys.stdout.buffer.write(encode(final))
        sys.stdout.flush()
        printer.report(result.diagnostics, context, stream=sys.stderr)
        if result.fixes_applied:
            printer.say(f"Fixed {_errors(result.fixes_applied)}.")
    else:
        printer.report(result.diagnostics, context)
    if result.error:
        print(f"error: {shown}: {result.error}", file=sys.stderr)
        return 2
    return 1 if failing(result.diagnostics) else 0


def _decoded(data: bytes, path: Path):
    """The text of stdin and how to encode text back (a notebook is UTF-8 JSON; a module is
    decoded as the interpreter would, its BOM and coding cookie kept)."""
    from linter.source import SourceError, decode

    if path.suffix == ".ipynb":
        try:
            return data.decode("utf-8"), lambda text: text.encode("utf-8")
        except UnicodeDecodeError as exc:
            raise StdinError(f"cannot decode notebook: {exc}") from None
    try:
        source = decode(data)
    except SourceError as exc:
        raise StdinError(str(exc)) from None
    return source.text, source.encode


def _diff(shown: str, before: str, after: str) -> str:
    if before == after:
        return ""
    if shown.endswith(".ipynb"):
        from linter.notebooks import cell_diff

        return cell_diff(shown, before, after)
    return unified_diff(shown, before, after)


def _errors(count: int) -> str:
    return f"{count} error{'s' if count != 1 else ''}"
