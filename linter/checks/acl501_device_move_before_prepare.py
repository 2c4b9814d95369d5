"""ACL501: a model moved to a hard-coded CUDA device before `prepare` places it."""

from __future__ import annotations

from linter.context import make_fix
from linter.model.cst_util import code
from linter.model.setup_facts import early_device_moves, moves_freely, unprepared_model_moves
from linter.types import Edit, Position


def check(ctx) -> None:
    """Report `.cuda()` / `.to("cuda")` on a model that `prepare` then places itself."""
    for move in early_device_moves(ctx.model):
        engine = move.prepare_stmt.node.value.func.value
        fix = None
        if moves_freely(ctx.model, move):
            fix = make_fix("Remove the device move (`prepare` places the model)", _edit(ctx, move))
        method = move.call.func.attr
        ctx.report(
            (ctx.span(method)[0], ctx.span(move.call)[1]),
            f"`{move.model_name}` is moved to a fixed CUDA device before "
            f"`{code(engine)}.prepare`: every rank first loads it onto GPU 0 (let `prepare` "
            f"place it, or use `{code(engine)}.device`)",
            fix,
        )
    for move in unprepared_model_moves(ctx.model):
        ctx.report(
            (ctx.span(move.call.func.attr)[0], ctx.span(move.call)[1]),
            f"hint: `{move.model_name}` is never passed to `prepare` and is moved to a fixed CUDA "
            f"device: every rank puts its copy on GPU 0 (use `.to({move.engine}.device)`)",
            severity="info",
        )


def _edit(ctx, move) -> Edit | None:
    """Drop the move from its chain (`Net().cuda()` -> `Net()`, `.to("cuda", dt)` -> `.to(dt)`),
    or the whole line when it only moved the model (`model.cuda()`)."""
    call = move.call
    if move.dtype is not None:
        arg = move.dtype
        dtype = ctx.text(arg.value)
        dtype = f"{arg.keyword.value}={dtype}" if arg.keyword is not None else dtype
        return ctx.replace(call, f"{ctx.text(call.func.value)}.to({dtype})")
    if move.statement_only and _only_statement_on_line(ctx, move.stmt):
        first, last = ctx.span(move.stmt.line)[0].line, ctx.span(move.stmt.line)[1].line
        return Edit(Position(first, 0), Position(last + 1, 0), "")
    if move.statement_only:
        return None
    return ctx.replace(call, ctx.text(call.func.value))


def _only_statement_on_line(ctx, stmt) -> bool:
    return len(stmt.line.body) == 1
