"""How the guard speaks: the linter's `path:line: CODE message` shape, a `help:` line with the
fix, tracebacks that end at the user's line, and the warn-mode summary.

A finding's message reads "what is wrong; what to do" (the checks write it that way), so the part
after the last top-level "; " is the fix shown on the `help:` line.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any, TextIO

DEBUG_ENV = "ACCEL_GUARD_DEBUG"
_TRACE_CALL_LIMIT = 10_000  # calls seen while the error unwinds before tracing gives up


def display_path(filename: str) -> str:
    """`train.py` for a file under the working directory, else the path as given."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if relative.startswith(os.pardir) else relative


def where(location: str | None) -> str:
    """`train.py:29` for a location `"/abs/train.py:29"` (`?` when unknown)."""
    if not location:
        return "?"
    filename, _, line = location.rpartition(":")
    return f"{display_path(filename)}:{line}" if filename and line.isdigit() else location


def explain_suffix(code: str) -> str:
    return f" (accel-lint --explain {code})"


def split_fix(code: str, message: str) -> tuple[str, str | None]:
    """(the problem, the fix) of a finding's message; the fix is None when none is spelled out."""
    suffix = explain_suffix(code)
    if message.endswith(suffix):
        message = message[: -len(suffix)]
    depth, cut = 0, -1
    for i, char in enumerate(message):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == ";" and depth == 0 and message[i + 1 : i + 2] == " ":
            cut = i
    if cut < 0 or not message[cut + 2 :].strip():
        return message, None
    return message[:cut], message[cut + 2 :].strip()


def error_text(code: str, message: str, location: str | None) -> str:
    """The text of a `GuardError`: the finding at the user's line, then what to do."""
    problem, fix = split_fix(code, message)
    if fix:
        help_line = f"help: {fix}{explain_suffix(code)}"
    else:
        help_line = f"help: see accel-lint --explain {code}"
    return f"{where(location)}: {code} {problem}\n{help_line}"


def warning_line(text: str, filename: str, lineno: int) -> str:
    """A warn-mode finding on one line: `path:line: CODE message`."""
    code, _, message = text.partition(": ")
    return f"{display_path(filename)}:{lineno}: {code} {message}\n"


# -- tracebacks that end at the user's frame ---------------------------------------------------


def end_traceback_at(frame: Any, error: BaseException) -> None:
    """Arrange for `error`'s traceback to stop at `frame` once it unwinds into it.

    The guard raises deep inside torch's hooks and its own checks; a reader looks at the last
    frame first, which should be the user's line. Frames below `frame` only exist once the error
    passed through them, so a local trace function on `frame` cuts the chain when the error
    arrives there (the approach of pdb's `set_trace`, used for one event). Left alone under
    ACCEL_GUARD_DEBUG=1, and when a debugger or coverage tool is tracing already."""
    if frame is None or os.environ.get(DEBUG_ENV, "") not in ("", "0") or sys.gettrace():
        return
    calls = [0]

    def stop() -> None:
        sys.settrace(None)
        frame.f_trace = None

    def local(current: Any, event: str, arg: Any) -> None:
        if event == "exception" and arg[1] is error:
            tb = arg[2]
            if tb is not None and tb.tb_frame is current:
                tb.tb_next = None
        stop()  # any event in `frame` (the error arrived, or was caught below it) ends tracing

    def calls_meanwhile(_frame: Any, _event: str, _arg: Any) -> None:
        calls[0] += 1  # the error was caught below `frame` and the program went on: give up
        if calls[0] > _TRACE_CALL_LIMIT:
            stop()

    frame.f_trace = local
    sys.settrace(calls_meanwhile)


def user_frames_only(tb: Any, is_internal) -> Any:
    """`tb` without its leading internal frames (`python -m guard`, runpy), for printing."""
    while tb is not None and tb.tb_next is not None and is_internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


# -- warnings in the `path:line: CODE message` shape -------------------------------------------


def use_finding_format(category: type) -> None:
    """Show `category` warnings in the linter's shape (others as before). Installed once, as a
    patch of `warnings.formatwarning` that `guard.uninstall()` undoes."""
    previous = warnings.formatwarning
    if getattr(previous, "_guard_finding_format", False):
        return

    def formatwarning(message, cat, filename, lineno, line=None):
        if isinstance(cat, type) and issubclass(cat, category):
            return warning_line(str(message), filename, lineno)
        return previous(message, cat, filename, lineno, line)

    formatwarning._guard_finding_format = True
    from guard import _patch

    _patch.patch(warnings, "formatwarning", formatwarning)


# -- the warn-mode summary ---------------------------------------------------------------------


def _groups(findings: Iterable[Any]) -> list[tuple[str, list[Any]]]:
    by_code: dict[str, list[Any]] = {}
    for f in sorted(findings, key=lambda r: (r.code, r.step, r.location or "")):
        by_code.setdefault(f.code, []).append(f)
    return list(by_code.items())


def _rule_name(code: str) -> str:
    try:
        from rules import ALL_RULES
    except ImportError:  # an installed guard without the catalogue package
        return ""
    rule = ALL_RULES.get(code)
    return rule.name if rule else ""


def summary_text(findings: list[Any]) -> str:
    """Plain text (CI logs): per code its count and first step, then one line per location."""
    if not findings:
        return "accel-guard: no findings"
    groups = _groups(findings)
    total = sum(f.count for f in findings)
    lines = [
        f"accel-guard summary: {total} finding(s) of {len(groups)} code(s) "
        f"at {len(findings)} location(s)"
    ]
    for code, rows in groups:
        count, first = sum(r.count for r in rows), min(r.step for r in rows)
        lines.append(f"{code} {_rule_name(code)}: {count}x, first at step {first}")
        for r in rows:
            problem, _ = split_fix(code, r.message)
            lines.append(f"  {where(r.location)}: {r.count}x from step {r.step}: {problem}")
    return "\n".join(lines)


def print_summary(findings: list[Any], stream: TextIO, terminal: bool | None = None) -> None:
    """A rich table when `stream` is a terminal, the plain text otherwise."""
    if terminal is None:
        terminal = bool(getattr(stream, "isatty", lambda: False)())
    if not terminal or not findings:
        print(summary_text(findings), file=stream)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="accel-guard summary", show_lines=False)
    for name, justify in (("code", "left"), ("count", "right"), ("first step", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_column("location", no_wrap=True)
    table.add_column("message")
    for code, rows in _groups(findings):
        count, first = sum(r.count for r in rows), min(r.step for r in rows)
        table.add_row(f"[bold]{code}[/]", str(count), str(first), "", escape(_rule_name(code)))
        for r in rows:
            problem, _ = split_fix(code, r.message)
            table.add_row("", str(r.count), str(r.step), escape(where(r.location)), escape(problem))
        table.add_section()
    Console(file=stream, force_terminal=True, soft_wrap=False).print(table)
