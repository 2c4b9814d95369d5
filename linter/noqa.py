"""`# noqa` suppression, as in ruff: on the diagnostic's first line, bare or with a list of codes.

`# noqa` (any case) suppresses every diagnostic starting on its line; `# noqa: ACL101, ACL303`
(commas and/or spaces) only those codes. Only real comments count: the text is tokenized so a
`"# noqa"` inside a string does nothing.
"""

from __future__ import annotations

import io
import re
import tokenize

from linter.types import Diagnostic

_DIRECTIVE = re.compile(
    r"#\s*noqa\b(?P<colon>:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)?)?", re.IGNORECASE
)
_SPLIT = re.compile(r"[\s,]+")
ALL = None  # a bare `# noqa`


def directives(text: str) -> dict[int, frozenset[str] | None]:
    """Line number -> the codes its `# noqa` names (ALL for a bare one)."""
    found: dict[int, frozenset[str] | None] = {}
    for line, comment in _comments(text):
        for match in _DIRECTIVE.finditer(comment):
            if match.group("colon") is None:
                found[line] = ALL
            elif match.group("codes") and found.get(line, frozenset()) is not ALL:
                codes = {c.upper() for c in _SPLIT.split(match.group("codes")) if c}
                found[line] = found.get(line, frozenset()) | codes
    return found


def _comments(text: str):
    if "noqa" not in text.lower():
        return
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
    except (tokenize.TokenError, SyntaxError):
        return


def suppressed(diagnostic: Diagnostic, table: dict[int, frozenset[str] | None]) -> bool:
    line = diagnostic.start.line
    if line not in table:
        return False
    codes = table[line]
    return codes is ALL or diagnostic.code in codes


def apply(text: str, diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """The diagnostics that no `# noqa` comment suppresses."""
    if not diagnostics:
        return diagnostics
    table = directives(text)
    return [d for d in diagnostics if not suppressed(d, table)]
