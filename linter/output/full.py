"""`--output-format full` (the default): each diagnostic with a source excerpt, a caret under its
range and the fix that would be applied, then a summary.

The text is built as (text, style) segments; rich is imported only when colour is wanted.
"""

from __future__ import annotations

from linter.fixer import apply_fixes
from linter.output import Context, fixable, placed, summary, where
from linter.source import SourceError, decode, read_bytes, split_lines
from linter.types import Diagnostic

Segment = tuple[str, str]  # (text, rich style; "" for none)
CONTEXT_LINES = 1
MAX_LINES = 6


def _source(path: str, memo: dict[str, str | None], context: Context) -> str | None:
    """The text that was linted: given in the context (stdin, a notebook's program) or read."""
    if path in context.sources:
        return context.sources[path]
    if path not in memo:
        try:
            memo[path] = decode(read_bytes(path)).text
        except SourceError:
            memo[path] = None
    return memo[path]


def header(diagnostic: Diagnostic, context: Context) -> list[Segment]:
    location = where(diagnostic, context)[len(diagnostic.path) :]  # ":12:5" or ":cell 3:12:5"
    segments = [
        (diagnostic.path, "bold"),
        (f"{location}: ", "cyan"),
        (diagnostic.code, "bold blue" if diagnostic.is_hint else "bold red"),
        (" ", ""),
    ]
    if fixable(diagnostic, context):
        segments.append(("[*] ", "cyan"))
    segments.append((placed(diagnostic, context)[1].message + "\n", ""))
    return segments


def excerpt(diagnostic: Diagnostic, lines: list[str]) -> list[Segment]:
    """The lines around the diagnostic with a caret line under its first line."""
    start, end = diagnostic.start, diagnostic.end
    first, last = _window(diagnostic, lines)
    width = len(str(last))
    gutter = " " * width + " |"
    segments: list[Segment] = [(gutter + "\n", "blue")]
    for number in range(first, last + 1):
        text = lines[number - 1]
        segments += [(f"{number:>{width}} | ", "blue"), (text + "\n", "")]
        if number == start.line:
            stop = end.column if end.line == start.line else len(text)
            carets = "^" * max(1, stop - start.column)
            segments += [(gutter + " " + " " * start.column, "blue"), (carets + "\n", "bold red")]
    segments.append((gutter + "\n", "blue"))
    return segments


def _window(diagnostic: Diagnostic, lines: list[str]) -> tuple[int, int]:
    """First and last line numbers shown for a diagnostic."""
    start, end = diagnostic.start, diagnostic.end
    last = min(len(lines), min(end.line, start.line + MAX_LINES) + CONTEXT_LINES)
    return max(1, start.line - CONTEXT_LINES), last


def footer(diagnostic: Diagnostic, width: int, text: str | None, notes=None) -> list[Segment]:
    """The fix's help and preview (`text` is the linted text), then the notes."""
    pad = " " * (width + 1)
    segments: list[Segment] = []
    if diagnostic.fix is not None:
        unsafe = " (unsafe)" if diagnostic.fix.applicability == "unsafe" else ""
        segments.append((f"{pad}= help: {diagnostic.fix.message}{unsafe}\n", "cyan"))
        if text is not None:
            segments += fix_preview(diagnostic, text, pad)
    notes = diagnostic.notes if notes is None else notes
    segments += [(f"{pad}= note: {note}\n", "") for note in notes]
    if diagnostic.configuration is not None:
        style = "yellow" if diagnostic.configuration.latent else ""
        segments.append((f"{pad}= config: {diagnostic.configuration.describe()}\n", style))
    return segments


def fix_preview(diagnostic: Diagnostic, text: str, pad: str) -> list[Segment]:
    """The lines this diagnostic's own fix changes, as - / + lines (at most MAX_LINES of each)."""
    fixed, applied = apply_fixes(text, [diagnostic.fix])
    if not applied:
        return []
    import difflib  # only a fix's preview

    before, after = split_lines(text), split_lines(fixed)
    segments: list[Segment] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, a1, a2, b1, b2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        segments += [(f"{pad}- {line}\n", "red") for line in before[a1:a2][:MAX_LINES]]
        segments += [(f"{pad}+ {line}\n", "green") for line in after[b1:b2][:MAX_LINES]]
    return segments


def segments_for(diagnostics: list[Diagnostic], context: Context) -> list[Segment]:
    memo: dict[str, str | None] = {}
    segments: list[Segment] = []
    for diagnostic in diagnostics:
        segments += header(diagnostic, context)
        text = _source(diagnostic.path, memo, context)
        cell, shown = placed(diagnostic, context)
        lines = split_lines(text) if text is not None else []
        if cell is not None:  # a notebook: the cell's own lines, numbered as the cell shows them
            lines = context.notebooks[diagnostic.path].lines[cell]
        width = 0
        if lines and shown.start.line <= len(lines):
            segments += excerpt(shown, lines)
            width = len(str(_window(shown, lines)[1]))
        segments += footer(diagnostic, width, text if lines else None, shown.notes)
        segments.append(("\n", ""))
    if not context.quiet:
        style = "bold" if diagnostics or context.unchecked else "green"
        segments.append((summary(diagnostics, context) + "\n", style))
    return segments


def render(diagnostics: list[Diagnostic], context: Context) -> str:
    segments = segments_for(diagnostics, context)
    if not context.colour:
        return "".join(text for text, _ in segments)
    return to_ansi(segments)


def to_ansi(segments: list[Segment]) -> str:
    import io

    from rich.console import Console
    from rich.text import Text

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, highlight=False, soft_wrap=True)
    console.print(Text.assemble(*segments), end="")
    return buffer.getvalue()
