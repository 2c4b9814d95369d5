"""ACL306: an engine configured for K > 1 whose batch loop never enters `accumulate()`."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model import accumulation
from linter.model.config_space import k_configuration
from linter.model.cst_util import code, int_value, walk
from linter.model.kinds import EngineKind, SiteKind
from linter.types import Edit, Position

_STEP_PART = (
    SiteKind.OPT_STEP,
    SiteKind.ZERO_GRAD,
    SiteKind.SCHED_STEP,
    SiteKind.SCALER_STEP,
    SiteKind.CLIP,
    SiteKind.UNSCALE,
)


def check(ctx: RuleContext) -> None:
    """Report the first backward of each loop that divides by K outside any window."""
    model = ctx.model
    for loop in model.loops:
        for site in loop.backwards:
            configured = _accumulating_engine(model, site)
            if configured is None or accumulation.windows_counted(model, loop, site):
                continue
            _report(ctx, loop, site, configured)
            break


def _accumulating_engine(model, site):
    """The configuration of the engine that owns this backward, when it accumulates: its
    `engine.backward`, or a raw backward of a loss computed by a prepared model."""
    scope = site.stmt.scope
    if site.kind == SiteKind.ENGINE_BACKWARD:
        engine = model.engine_for(site.receiver, scope)
        if engine is None or engine.kind not in (
            EngineKind.ACCELERATE,
            EngineKind.GUARD,
            EngineKind.UNKNOWN,
        ):
            return None
        name = site.receiver
    elif _loss_of_prepared_model(model, site):
        name = model.engine_in_scope(scope)
    else:
        return None
    configured = accumulation.configured_for(model, name)
    if configured is None or configured.kind not in (EngineKind.ACCELERATE, EngineKind.GUARD):
        return None
    return configured if configured.accumulates else None


def _loss_of_prepared_model(model, site) -> bool:
    if not model.setup.constructs_engine():
        return False
    flow = model.flow(site)
    scope = site.stmt.scope
    return flow is not None and any(model.derives_from_prepared(m, scope) for m in flow.models)


def _report(ctx: RuleContext, loop, site, configured) -> None:
    k = configured.value
    n = str(int_value(k)) if int_value(k) is not None else f"`{code(k)}`"
    engine = configured.engine
    fix, note = _fix(ctx, loop, site, engine)
    effect = (
        f"every loss is divided by {n} and the optimizer still steps on every batch, with "
        f"1/{n} of the gradient"
        if site.kind == SiteKind.ENGINE_BACKWARD
        else f"the optimizer steps on every batch, so the {n}-step accumulation never happens"
    )
    ctx.report(
        site.call,
        f"`{engine}` is configured for {n} accumulation steps, but this loop never enters "
        f"`{engine}.accumulate(...)`: {effect}",
        fix,
        notes=(note,) if note else (),
        configuration=k_configuration(ctx.model, k),
    )


# --- the fix ------------------------------------------------------------------------------
def _fix(ctx: RuleContext, loop, site, engine: str):
    """Wrap the loop body, from the forward to the optimizer calls, in one accumulate block."""
    model = ctx.model
    if not isinstance(loop.node, (cst.For, cst.While)):
        return (
            None,
            "the backward is in a per-batch function: enter accumulate() where it is called",
        )
    models = _prepared_models(model, site)
    if not models:
        return None, "wrap the step in `with accumulate(<the prepared models>):` by hand"
    body = loop.node.body
    if not isinstance(body, cst.IndentedBlock):
        return None, None
    first, last = _span(model, loop, site, body.body)
    if first is None:
        return None, None
    edit = _wrap(
        ctx, body.body[first : last + 1], f"with {engine}.accumulate({', '.join(models)}):"
    )
    if edit is None:
        return None, None
    message = f"Wrap the step in `with {engine}.accumulate({', '.join(models)}):`"
    return make_fix(message, edit), None


def _prepared_models(model, site) -> list[str]:
    flow = model.flow(site)
    names = sorted(flow.models) if flow is not None else []
    return [n for n in names if n in model.setup.prepared]


def _span(model, loop, site, statements) -> tuple[int | None, int | None]:
    """Indexes of the first body statement holding the forward (or the backward) and of the
    last one holding an optimizer-side call."""
    flow = model.flow(site)
    steps = [stmt for _, stmt in flow.steps] if flow is not None else []
    models = flow.models if flow is not None else set()
    forwards = [s for s in steps if _calls_one_of(s, models)]
    starts = (forwards if models else steps) + [site.stmt]
    ends = [s.stmt for s in loop.sites if s.kind in _STEP_PART] + [site.stmt]
    first = min((i for i, s in enumerate(statements) if _holds(s, starts)), default=None)
    last = max((i for i, s in enumerate(statements) if _holds(s, ends)), default=None)
    if first is None or last is None or last < first:
        return None, None
    return first, last


def _calls_one_of(stmt, models: set[str]) -> bool:
    """The statement runs the forward of one of the loss's models (`out = model(**batch)`)."""
    return any(isinstance(n, cst.Call) and code(n.func) in models for n in walk(stmt.node))


def _holds(statement: cst.CSTNode, stmts) -> bool:
    return any(s.line is statement or any(f.node is statement for f in s.frames) for s in stmts)


def _wrap(ctx: RuleContext, statements, header: str) -> Edit | None:
    """Indent whole lines one level under `header` (comments and blank lines kept)."""
    if any(_multiline_string(s) for s in statements):
        return None  # indenting would change the string's text
    first = ctx.line_of(statements[0])
    last = ctx.span(statements[-1])[1].line
    if ctx.lines[first - 1][: ctx.span(statements[0])[0].column].strip():
        return None
    indent = ctx.indentation(first)
    body = [
        (ctx.indent_unit + text) if text.strip() else text for text in ctx.lines[first - 1 : last]
    ]
    content = f"{indent}{header}\n" + "\n".join(body)
    return Edit(Position(first, 0), Position(last, len(ctx.lines[last - 1])), content)


def _multiline_string(statement: cst.CSTNode) -> bool:
    for node in walk(statement, into_scopes=True):
        if isinstance(node, cst.SimpleString) and "\n" in node.value:
            return True
        if isinstance(node, cst.FormattedStringText) and "\n" in node.value:
            return True
    return False
