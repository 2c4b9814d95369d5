"""ACL501: a model moved to a device that is GPU 0 on every rank: a fixed index, or a bare
`"cuda"` before the Accelerator has set the rank's device."""

from __future__ import annotations

from linter.context import RuleContext, make_fix
from linter.model.cst_util import code
from linter.model.setup_facts import early_device_moves, moves_freely, unprepared_model_moves
from linter.types import Edit, Position


def check(ctx: RuleContext) -> None:
    """Report moves of prepared models (fixed when nothing before `prepare` needs the device)
    and of helpers never prepared (no fix); a helper moved to a bare "cuda" after the engine
    exists is on the rank's own GPU, at most a style hint."""
    for move in early_device_moves(ctx.model):
        engine = code(move.prepare_stmt.node.value.func.value)
        fix = None
        if moves_freely(ctx.model, move):
            fix = make_fix("Remove the device move (`prepare` places the model)", _edit(ctx, move))
        if move.pinned:
            where = (
                f"is moved to `{move.pinned}` before `{engine}.prepare`: every rank first loads "
                f"it onto GPU {move.pinned[5:]}"
            )
        else:
            where = (
                f'is moved to CUDA before {_engine_made(ctx, engine)}: until then `"cuda"` is '
                "GPU 0 on every rank, so every rank first loads a full copy there"
            )
        ctx.report(
            _span(ctx, move.call),
            f"`{move.model_name}` {where} (let `prepare` place it, or use `{engine}.device`)",
            fix,
        )
    for move in unprepared_model_moves(ctx.model):
        name, engine = move.model_name, move.engine
        if move.kind == "pinned":
            message = (
                f"`{name}` is never passed to `prepare` and is moved to `{move.pinned}`: every "
                f"rank keeps its copy on GPU {move.pinned[5:]} (use `.to({engine}.device)`)"
            )
        elif move.kind == "early":
            message = (
                f"`{name}` is never passed to `prepare` and is moved to CUDA before "
                f'{_engine_made(ctx, engine)}, when `"cuda"` is GPU 0 on every rank: every '
                f"rank keeps its copy there (move it after that, with `.to({engine}.device)`)"
            )
        else:
            ctx.report(
                _span(ctx, move.call),
                f"hint: `{name}` is moved to a bare CUDA device; once `{engine}` exists that is "
                f"this rank's own GPU, and `.to({engine}.device)` says so (and also runs where "
                "the device is not CUDA)",
                severity="info",
            )
            continue
        ctx.report(_span(ctx, move.call), message)


def _span(ctx, call):
    """From the method name to the end of the call (`cuda()`, `to("cuda")`)."""
    return ctx.span(call.func.attr)[0], ctx.span(call)[1]


def _engine_made(ctx, engine: str) -> str:
    """ "`accelerator = Accelerator(...)` (line 12)", or the engine's name when it is not built
    here."""
    built = ctx.model.setup.engines.get(engine)
    if built is None or built.node is None:
        return f"`{engine}` is created"
    return f"`{engine}` is created (line {ctx.line_of(built.node)})"


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
