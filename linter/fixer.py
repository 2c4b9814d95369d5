"""Apply fixes to a module's text until nothing changes, never producing code that does not parse.

Each round applies every selected fix whose edits overlap no edit already taken (the rest wait for
the next round), then re-analyses the new text. A round whose result does not parse is discarded:
the text from before it is kept and the failure is reported as an internal fix error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from linter.source import line_starts
from linter.types import Diagnostic, Edit, Fix

MAX_ROUNDS = 10
_LONE_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclass
class FixOutcome:
    text: str
    diagnostics: list[Diagnostic]  # what remains in `text`
    fixed: int  # number of fixes applied
    error: str | None = None


def applicable(diagnostic: Diagnostic, unsafe: bool) -> bool:
    fix = diagnostic.fix
    return fix is not None and bool(fix.edits) and (fix.applicability == "safe" or unsafe)


def fix_text(
    text: str,
    analyse: Callable[[str], list[Diagnostic]],
    unsafe: bool,
    newline: str = "\n",
    diagnostics: list[Diagnostic] | None = None,
) -> FixOutcome:
    """Fix `text` in rounds; `analyse` gives unsuppressed diagnostics or raises ParseFailure."""
    from linter.analysis import ParseFailure

    current = diagnostics if diagnostics is not None else analyse(text)
    fixed = 0
    for _ in range(MAX_ROUNDS):
        fixes = [d.fix for d in current if applicable(d, unsafe)]
        new_text, applied = apply_fixes(text, fixes, newline)
        if applied == 0 or new_text == text:
            break
        try:
            current = analyse(new_text)
        except ParseFailure as failure:
            error = f"a fix produced invalid syntax ({failure.message}); fixes were not applied"
            return FixOutcome(text, current, fixed, error)
        text, fixed = new_text, fixed + applied
    return FixOutcome(text, current, fixed)


def apply_fixes(text: str, fixes: list[Fix], newline: str = "\n") -> tuple[str, int]:
    """Apply the fixes that do not overlap, in order of position; returns text and count."""
    starts = line_starts(text)
    taken: list[tuple[int, int]] = []
    chosen: list[tuple[int, int, str]] = []
    applied = 0
    for fix in sorted(fixes, key=lambda f: min(e.start for e in f.edits)):
        spans = [(_offset(starts, e.start), _offset(starts, e.end), e) for e in fix.edits]
        if any(_overlaps(s, e, ts, te) for s, e, _ in spans for ts, te in taken):
            continue
        if any(_overlaps(*a[:2], *b[:2]) for i, a in enumerate(spans) for b in spans[i + 1 :]):
            continue  # a fix whose own edits collide is malformed: skip it
        taken += [(s, e) for s, e, _ in spans]
        chosen += [(s, e, _with_newline(edit, newline)) for s, e, edit in spans]
        applied += 1
    for start, end, content in sorted(chosen, key=lambda c: (c[0], c[1]), reverse=True):
        text = text[:start] + content + text[end:]
    return text, applied


def _overlaps(start: int, end: int, other_start: int, other_end: int) -> bool:
    """Ranges share text, or two edits land on the same point (their order would be ambiguous)."""
    return (start < other_end and other_start < end) or start == other_start


def _offset(starts: list[int], position) -> int:
    return starts[position.line - 1] + position.column


def _with_newline(edit: Edit, newline: str) -> str:
    """Edit content with the file's own line endings (fixes on CRLF files stay CRLF)."""
    if newline == "\n" or not edit.content:
        return edit.content
    return _LONE_NEWLINE.sub(newline, edit.content)
