"""ACL312: a modulo step gate that fires one micro-batch off its window's end."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.model import windows
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code


def check(ctx: RuleContext) -> None:
    for _, window in windows.window_gates(ctx.model):
        if window.error() in (-1, 1):
            _report(ctx, window)


def _report(ctx, window) -> None:
    error = window.error()
    offset = window.offset - error
    left = _shifted(window.index, offset)
    fix = make_fix(
        f"Count the window from 1 (`{left} % {code(window.k)}`)",
        ctx.replace(window.modulo, f"{left} % {code(window.k)}"),
    )
    k = code(window.k)
    fires = f"1, {k} + 1, 2 * {k} + 1" if error == -1 else f"{k} - 1, 2 * {k} - 1"
    ctx.report(
        window.comparison,
        f"the step gate `{code(window.comparison)}` is off by one for an index that starts at "
        f"{_start(window)}: it closes windows on micro-batches {fires}, ... instead of {k}, "
        f"2 * {k}, ..., so the first update averages the wrong number of micro-batches and "
        "every later window is shifted",
        fix,
        configuration=gate_configuration(ctx.model, window.gate, window.scope),
    )


def _shifted(index: str, offset: int) -> str:
    if offset == 0:
        return index
    return f"({index} + {offset})" if offset > 0 else f"({index} - {-offset})"


def _start(window) -> str:
    """How the index starts, in the words of the message."""
    base = window.base
    if base.source == "enumerate":
        return f"{base.first} (`enumerate`)"
    return f"{base.first} at the gate (a counter)"
