"""ACL307: a modulo step gate over a sized loader with no last-batch clause."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model import windows
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code
from linter.model.kinds import RegionKind


def check(ctx: RuleContext) -> None:
    model = ctx.model
    for _, window in windows.window_gates(model):
        if _drops_tail(model, window):
            _report(ctx, window)


def _drops_tail(model, window) -> bool:
    """The gate reads the `enumerate` index of a loop over a loader with a length (or a
    counter restarted for each pass over it) and has no last-batch clause. Left alone:
    counters kept across epochs (`global_step % K`) and loops over iterables without a
    length, where windows span epochs on purpose; one pass over the loader ended by a step
    budget that can come before its end (not one sized from epochs or a length);
    `accumulate()`, which flushes the tail of a prepared loader; a step elsewhere that
    flushes the tail."""
    base = window.base
    if base is None or not base.sized:
        return False
    if window.last_batch_clause or windows.tail_flushed_elsewhere(model, window):
        return False
    if windows.single_pass(model, window) and windows.ends_on_a_budget(model, window):
        return False
    if windows.skips_partial_windows(model, window):
        return False
    return not any(model.regions_around(s, RegionKind.ACCUMULATE) for s in _gate_stmts(window))


def _gate_stmts(window):
    return [s for s in window.scope.stmts if any(f.node is window.gate.node for f in s.frames)]


def _report(ctx, window) -> None:
    target, holds = windows.edited_condition(window)
    loader = code(window.base.loader)
    fix, notes = None, ()
    if window.before_backward:
        notes = (
            "the gate runs before the batch's backward, so a last-batch clause there would step "
            "before the last micro-batch: step the tail after the loop instead",
        )
    else:
        last = _last_index_test(window, loader, holds)
        text = code(target)
        if isinstance(target, (cst.BooleanOperation, cst.IfExp, cst.NamedExpr, cst.Lambda)):
            text = f"({text})"
        joined = f"{text} or {last}" if holds else f"{text} and {last}"
        edit = ctx.replace(target, joined)
        fix = make_fix(f"Also step on the last batch (`{last}`)", edit)
    left = _left_over(window, f"len({loader})")
    if window.before_backward:
        count = f"the last `{left}` micro-batches of each epoch (at least one)"
    else:
        count = f"the last `{left}` micro-batches of each epoch (whenever that is not 0)"
    if windows.single_pass(ctx.model, window):
        fate = "the loop is the only pass over the loader, so they are lost"
    elif (discarded := windows.discarded_between_passes(ctx.model, window)) is not None:
        where = "in the epoch loop"
        if not discarded.stmt.loops():
            where = "outside the loop, run once an epoch,"
        fate = f"`{code(discarded.call or discarded.node)}` {where} discards them"
    else:
        fate = "they leak into the next epoch's first window, and the last epoch's are lost"
    ctx.report(
        target,
        f"the step gate `{code(window.comparison)}` has no last-batch clause: {count} never "
        f"reach the optimizer in their epoch ({fate})",
        fix,
        notes=notes,
        configuration=gate_configuration(ctx.model, window.gate, window.scope),
    )


def _left_over(window, length: str) -> str:
    """What the gate leaves after its last update of a pass of `length` micro-batches.

    The gate fires on the n-th micro-batch when n + c is a multiple of K, with c = first - 1 +
    offset - remainder (`(i + 1) % K == 0` and `i % K == K - 1` over a 0-based index: c = 0;
    `i % K == 0`: c = -1), so after the backward `(length + c) % K` remain; a gate before the
    backward steps the micro-batches before its own, one more."""
    c = window.base.first - 1 + window.offset - window.remainder
    k = code(window.k)
    if not isinstance(window.k, (cst.Name, cst.Attribute, cst.Subscript, cst.Integer)):
        k = f"({k})"
    if window.k_value is not None and window.k_value > 1:
        c %= window.k_value
    total = length if c == 0 else f"({length} {'+' if c > 0 else '-'} {abs(c)})"
    left = f"{total} % {k}"
    return f"{left} + 1" if window.before_backward else left


def _last_index_test(window, loader: str, holds: bool) -> str:
    """`i + 1 == len(dl)` for a 0-based index (`i == len(dl)` from `start=1`)."""
    index, shift = window.index, 1 - window.base.first
    left = index if shift == 0 else f"{index} + {shift}" if shift > 0 else f"{index} - {-shift}"
    return f"{left} {'==' if holds else '!='} len({loader})"
