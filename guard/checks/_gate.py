"""The line of the `if` that gates an optimizer step, read from the user's source.

A finding about the step gate (ACL307's missing last-batch clause) belongs at the gate, where the
fix goes, not at the loop or the `step()` call. The guard only sees the call's frames, so the
gate is found in the source of those frames (read when a finding is reported, never on the step
path): the outermost `if` around the call before a loop or function boundary (an `if use_amp:`
nested in the gate is not the gate), preferring one whose test takes a modulo; a test that is a
bare name (`update = (i + 1) % K == 0` ... `if update:`) points at the name's assignment.
"""

from __future__ import annotations

import ast
import functools
import linecache
from collections.abc import Callable

from guard import _report

_BOUNDARIES = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
)
_MAX_FRAMES = 4  # the step call, and the helpers' callers that may hold the gate


def call_sites() -> tuple[tuple[str, int], ...]:
    """(file, line) of the user's frames around the current call, innermost first."""
    frame, sites = _report.user_frame(), []
    while frame is not None and len(sites) < _MAX_FRAMES:
        if not _report._is_internal(frame.f_code.co_filename):
            sites.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(sites)


def gate_location(sites: tuple[tuple[str, int], ...]) -> str | None:
    """file:line of the gate around the first of `sites` that has one, else None."""
    return first_found(sites, _gate_line)


def first_found(
    sites: tuple[tuple[str, int], ...], find: Callable[[str, int], int | None]
) -> str | None:
    """file:line of what `find(filename, line)` finds for the first of `sites` (innermost
    first) where it finds something, else None."""
    for filename, line in sites:
        found = find(filename, line)
        if found is not None:
            return f"{filename}:{found}"
    return None


@functools.lru_cache(maxsize=64)
def _gate_line(filename: str, line: int) -> int | None:
    tree = parse(filename)
    if tree is None:
        return None
    path = enclosing(tree, line)
    gates: list[ast.If] = []
    scope: ast.AST = tree
    for node in reversed(path[:-1]):
        if isinstance(node, _BOUNDARIES):
            scope = node
            break
        if isinstance(node, ast.If):
            gates.append(node)
    if not gates:
        return None
    gate = next((g for g in gates if _takes_modulo(g.test)), gates[-1])
    if isinstance(gate.test, ast.Name):
        return _assigned_at(scope, gate.test.id, gate.lineno) or gate.lineno
    return gate.lineno


def parse(filename: str) -> ast.Module | None:
    """The user's module as an ast (None when its source cannot be read or parsed)."""
    source = "".join(linecache.getlines(filename))
    if not source:
        return None
    try:
        return ast.parse(source, filename)
    except (SyntaxError, ValueError, RecursionError):
        return None


def enclosing(tree: ast.AST, line: int) -> list[ast.AST]:
    """The statements that enclose `line`, outermost first, down to the innermost one."""
    path, node = [], tree
    while True:
        inner = next(
            (
                child
                for child in ast.iter_child_nodes(node)
                if isinstance(child, (ast.stmt, ast.excepthandler))
                and child.lineno <= line <= (child.end_lineno or 0)
            ),
            None,
        )
        if inner is None:
            return path
        path.append(inner)
        node = inner


def _takes_modulo(test: ast.expr) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(test))


def _assigned_at(scope: ast.AST, name: str, before: int) -> int | None:
    """The line of the last assignment to `name` in `scope` before line `before`."""
    lines = [
        node.lineno
        for node in ast.walk(scope)
        if isinstance(node, ast.Assign)
        and node.lineno < before
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    return max(lines, default=None)
