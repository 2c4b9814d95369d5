"""Code actions: each finding's fix, "Fix all accel-lint findings", "Disable CODE for this line".

Quick fixes reuse the edits the rule attached to its finding; the fix-all action runs the same
fix loop as `accel-lint --fix` (rounds until nothing changes, never invalid syntax) and the noqa
action the same writer as `--add-noqa`; both send the changed lines as one edit. Unsafe fixes
are offered only where the file's project sets `unsafe-fixes`, as the CLI applies them only then.
"""

from __future__ import annotations

import re

from lsprotocol import types

from linter.server.convert import Lines, overlaps, text_edit, to_lsp
from linter.server.documents import Linted
from linter.types import Diagnostic, Position

FIX_ALL_KIND = f"{types.CodeActionKind.SourceFixAll.value}.accel-lint"
FIX_ALL_TITLE = "Fix all accel-lint findings"
PARSE_ERROR = "ACL000"
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # each line with its ending


def wanted(kind: str, only: list[str] | None) -> bool:
    """LSP's kind filter: `source.fixAll` asks for `source.fixAll.accel-lint` too."""
    return not only or any(kind == o or kind.startswith(f"{o}.") for o in only)


def offered(diagnostic: Diagnostic, unsafe: bool) -> bool:
    fix = diagnostic.fix
    return fix is not None and bool(fix.edits) and (fix.applicability == "safe" or unsafe)


def quick_fixes(linted: Linted, lines: Lines, start: Position, end: Position) -> list:
    """One action per finding in the range that has an offered fix, then the noqa actions (one
    per code and line: two findings of one code on a line need one comment)."""
    uri = linted.snapshot.uri
    fixes, disables, seen = [], [], set()
    for diagnostic in linted.diagnostics:
        if not overlaps(diagnostic, start, end) or diagnostic.code == PARSE_ERROR:
            continue
        lsp_diagnostic = to_lsp(diagnostic, lines)
        if offered(diagnostic, linted.unsafe_fixes):
            edits = [text_edit(e, lines) for e in diagnostic.fix.edits]
            fixes.append(_action(_fix_title(diagnostic), uri, edits, lsp_diagnostic))
            fixes[-1].is_preferred = diagnostic.fix.applicability == "safe"
        key = (diagnostic.code, diagnostic.start.line)
        noqa = None if key in seen else noqa_edit(linted.snapshot.text, diagnostic, lines)
        seen.add(key)
        if noqa is not None:
            title = f"Disable {diagnostic.code} for this line"
            disables.append(_action(title, uri, [noqa], lsp_diagnostic))
    return fixes + disables


def _fix_title(diagnostic: Diagnostic) -> str:
    title = f"{diagnostic.code}: {diagnostic.fix.message}"
    return title if diagnostic.fix.applicability == "safe" else f"{title} (unsafe)"


def fixable(linted: Linted) -> bool:
    return any(offered(d, linted.unsafe_fixes) for d in linted.diagnostics)


def fix_all(linted: Linted, fixed_text: str, lines: Lines) -> types.CodeAction | None:
    """The fix-all action: the lines the fix loop changed, replaced in one edit."""
    edit = changed_span(linted.snapshot.text, fixed_text, lines)
    if edit is None:
        return None
    action = _action(FIX_ALL_TITLE, linted.snapshot.uri, [edit], None)
    action.kind = FIX_ALL_KIND
    return action


def changed_span(before: str, after: str, lines: Lines) -> types.TextEdit | None:
    """One edit replacing the lines that differ (compared whole: fast, and readable in an
    editor's preview)."""
    if before == after:
        return None
    old, new = _LINES.findall(before), _LINES.findall(after)
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    start = Position(head + 1, 0)
    end = Position(len(old) - tail + 1, 0) if tail else lines.end()
    replacement = "".join(new[head : len(new) - tail])
    return types.TextEdit(range=lines.range(start, end), new_text=replacement)


def _action(title, uri, edits, diagnostic) -> types.CodeAction:
    return types.CodeAction(
        title=title,
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic] if diagnostic else None,
        edit=types.WorkspaceEdit(changes={uri: edits}),
    )


def noqa_edit(text: str, diagnostic: Diagnostic, lines: Lines) -> types.TextEdit | None:
    """The edit `--add-noqa` would make for this one finding: its code added to the line's noqa
    comment, or a new one. None where the line cannot take a comment (it ends inside a string
    or on a backslash)."""
    from linter import noqa

    new_text, changed, _ = noqa.add_directives(text, [diagnostic])
    return changed_span(text, new_text, lines) if changed else None
