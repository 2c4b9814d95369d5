"""`# noqa` suppression, as in ruff: on the diagnostic's first line, bare or with a list of codes.

`# noqa` (any case) suppresses every diagnostic starting on its line; `# noqa: ACL101, ACL303`
(commas and/or spaces) only those codes. Only real comments count: the text is tokenized so a
`"# noqa"` inside a string does nothing. `add_directives` writes them (`--add-noqa`), merging
the codes of a directive already on the line.
"""

from __future__ import annotations

import io
import re
import tokenize

from linter.selection import PARSE_ERROR
from linter.types import Diagnostic

_DIRECTIVE = re.compile(
    r"#\s*noqa\b(?P<colon>:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)?)?", re.IGNORECASE
)
_SPLIT = re.compile(r"[\s,]+")
_LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
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


def add_directives(text: str, diagnostics: list[Diagnostic]) -> tuple[str, int, int]:
    """`text` with `# noqa: CODE` on each line where a diagnostic starts; the number of lines
    changed, and of diagnostics left because their line cannot take a comment (it ends inside a
    string or on a backslash). Syntax errors (ACL000) are never suppressed."""
    wanted: dict[int, set[str]] = {}
    for diagnostic in diagnostics:
        if diagnostic.code != PARSE_ERROR:
            wanted.setdefault(diagnostic.start.line, set()).add(diagnostic.code)
    if not wanted:
        return text, 0, 0
    open_lines, comments = _line_ends(text)
    parts = _LINE_BREAK.split(text)  # content, newline, content, newline, ..., content
    changed = left = 0
    for line, codes in sorted(wanted.items()):
        if line in open_lines or 2 * (line - 1) >= len(parts):
            left += sum(d.start.line == line and d.code in codes for d in diagnostics)
            continue
        parts[2 * (line - 1)] = _with_codes(parts[2 * (line - 1)], comments.get(line), codes)
        changed += 1
    return "".join(parts), changed, left


def _line_ends(text: str) -> tuple[set[int], dict[int, tuple[int, str]]]:
    """Lines that end inside a token (a string) or on a backslash, and each line's comment."""
    ended: set[int] = set()
    comments: dict[int, tuple[int, str]] = {}
    lines = text.count("\n") + 1
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = (token.start[1], token.string)
            elif token.type in (tokenize.NEWLINE, tokenize.NL):
                ended.add(token.start[0])
    except (tokenize.TokenError, SyntaxError):
        return set(range(1, lines + 1)), {}  # not Python the tokenizer reads: change nothing
    return {n for n in range(1, lines + 1) if n not in ended}, comments


def _with_codes(line: str, comment: tuple[int, str] | None, codes: set[str]) -> str:
    """The line with a directive naming `codes`, merged into its own directive when it has one."""
    if comment is not None:
        column, text = comment
        match = _DIRECTIVE.search(text)
        if match is not None:
            old = _SPLIT.split(match.group("codes") or "")
            merged = [c for c in old if c] + sorted(codes - {c.upper() for c in old})
            directive = text[match.start() : match.start("colon")] + ": " + ", ".join(merged)
            new_comment = text[: match.start()] + directive + text[match.end() :]
            return line[:column] + new_comment + line[column + len(text) :]
    return f"{line.rstrip()}  # noqa: {', '.join(sorted(codes))}"
