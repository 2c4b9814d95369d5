"""ACL101's static check (the record and docs: `rules/acl101_raw_backward.py`)."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model import accumulation
from linter.model.accumulation import divides_like_engine
from linter.model.config_space import k_configuration
from linter.model.cst_util import code, dotted, int_value, strip_parens
from linter.model.kinds import FrameKind, ScalerRole, SiteKind
from linter.model.loops import same_path
from linter.types import Configuration, Edit, Position


def check(ctx: RuleContext) -> None:
    """Report raw backward calls in loops owned by an engine or an enabled GradScaler."""
    model = ctx.model
    has_engine = model.setup.constructs_engine()
    for loop in model.loops:
        for site in loop.of_kind(SiteKind.BACKWARD):
            if _already_scaled(model, site) or _other_branch_owns_backward(model, loop, site):
                continue
            scaler = _stepping_scaler(model, loop, site)
            if scaler is not None:
                _report_scaler(ctx, site, scaler)
            elif has_engine and _flows_from_prepared(model, site):
                _report_engine(ctx, loop, site)


def _stepping_scaler(model, loop, backward) -> str | None:
    """The enabled GradScaler this loop steps (or unscales), itself or through a function it
    calls, in an iteration that runs the backward; a scaler stepped only in another branch
    (`if scaler is None: loss.backward()`) owns a different path."""
    for site in loop.of_kind(SiteKind.SCALER_STEP, SiteKind.UNSCALE):
        if not same_path(site.stmt, backward.stmt):
            continue
        if model.scaler_role(site.receiver, site.stmt.scope) == ScalerRole.ENABLED:
            return site.receiver
    for call, site in model.step_helper_sites(loop, SiteKind.SCALER_STEP, SiteKind.UNSCALE):
        if same_path(call, backward.stmt) and _visible_from(site, loop.scope):
            if model.scaler_role(site.receiver, site.stmt.scope) == ScalerRole.ENABLED:
                return site.receiver
    caller = loop.gate.caller if loop.gate is not None else None
    for site in model.reached_sites(loop, backward.stmt, SiteKind.SCALER_STEP) if caller else ():
        if site.stmt.scope is caller and _visible_from(site, loop.scope):  # `train_step` steps
            if model.scaler_role(site.receiver, site.stmt.scope) == ScalerRole.ENABLED:
                return site.receiver
    return None


def _visible_from(site, scope) -> bool:
    """Whether the loop's `scope` can name the scaler that a stepping function uses: one read
    from an enclosing scope (`def step(): scaler.step(opt)`), or `self.scaler` in a method of
    the same class."""
    head = (site.receiver or "").split(".", 1)[0]
    helper = site.stmt.scope
    if head == "self":
        return helper.class_name is not None and helper.class_name == scope.class_name
    return bool(head) and head not in helper.params and head not in helper.defs


def _already_scaled(model, site) -> bool:
    if site.scaler is not None:
        return True  # a loss scaler's call: its `__call__` scales the loss it is handed
    loss = model.loss_expr(site)
    func = site.call.func
    scope = site.stmt.scope
    if model.is_backward_function(site.call):
        return loss is not None and model.scaled_loss(loss, scope) is not None
    if not isinstance(func, cst.Attribute):
        return False
    if isinstance(func.value, cst.Name) and model.scale_loss_source(dotted(func.value), scope):
        return True  # apex: `with amp.scale_loss(loss, opt) as scaled: scaled.backward()`
    return model.is_scaled_loss(func.value, scope, site.stmt.order)


def _other_branch_owns_backward(model, loop, site) -> bool:
    """`if fp16: scaler.scale(loss).backward() else: loss.backward()`: a deliberate fp32 path."""
    mine = {(id(f.node), f.holds) for f in site.stmt.frames if f.kind == FrameKind.IF}
    for other in loop.backwards:
        if other is site or not (
            other.kind == SiteKind.ENGINE_BACKWARD or _already_scaled(model, other)
        ):
            continue
        for frame in other.stmt.frames:
            if frame.kind == FrameKind.IF and (id(frame.node), not frame.holds) in mine:
                return True
    return False


def _flows_from_prepared(model, site) -> bool:
    """False when the loss visibly comes from models that were never prepared, or comes from
    nowhere visible in a function that no prepared object can reach."""
    if not model.setup.prepared:
        return False  # an Accelerator used only for its device or logging owns no backward
    scope = site.stmt.scope
    flow = model.flow(site)
    if flow is None or not flow.models:
        return model.prepared_in_reach(scope)
    return any(model.derives_from_prepared(name, scope) for name in flow.models)


def _loss_and_rest(ctx, site):
    """(loss node, extra argument text) or None when the call cannot be rewritten safely."""
    call = site.call
    args = list(call.args)
    if not ctx.model.is_backward_function(call):
        loss = call.func.value
    elif args and args[0].keyword is None and not args[0].star:
        loss, args = args[0].value, args[1:]
        if isinstance(loss, (cst.List, cst.Tuple)) or ctx.model.names_a_sequence(loss, site.stmt):
            return None
    else:
        return None
    if any(a.keyword is None for a in args):
        return None
    rest = "".join(f", {a.keyword.value}={ctx.text(a.value)}" for a in args)
    return loss, rest


def _report_engine(ctx, loop, site) -> None:
    model = ctx.model
    engine = model.engine_in_scope(site.stmt.scope)
    name = engine or "accelerator"
    fix = None
    parts = _loss_and_rest(ctx, site)
    windowless = _k_not_applied(model, loop, site, name)
    if engine is not None and parts is not None:
        loss, rest = parts
        loss = _without_engine_division(model, engine, strip_parens(loss))
        edit = ctx.replace(site.call, f"{engine}.backward({code(loss)}{rest})")
        edits = [edit, *_named_division_edits(ctx, site, engine, loss)]
        # without ACL306's `accumulate()` the engine's backward divides by K while the
        # optimizer steps on every batch: alone, the edit would shrink every update K times
        fix = make_fix(
            f"Use `{engine}.backward(...)`",
            *edits,
            applicability="unsafe" if windowless else None,
        )
    facts, launch_only = _what_is_bypassed(model, site, name, windowless)
    ctx.report(
        site.call,
        f"raw backward bypasses `{name}.backward(loss)`: {facts}",
        fix,
        configuration=_LAUNCHED_WITH_AN_ENGINE
        if launch_only
        else _k_configuration(model, name, site),
    )


# The precision is pinned and K's division is not missed: only a launch config that makes the
# Accelerator a DeepSpeed (or Megatron-LM) one, whose engine must run the backward, is hurt.
_LAUNCHED_WITH_AN_ENGINE = Configuration(
    affects_default=False,
    condition="when launched with a DeepSpeed or Megatron-LM config (`accelerate launch`)",
    knobs=("distributed_type",),
)


def _k_configuration(model, name: str, site):
    """Under an fp32 engine the bypass costs only K's division: it is real when K > 1."""
    engine = model.engine_for(name, site.stmt.scope)
    if engine is None or engine.accum is None or engine.mixed_precision != "no":
        return None
    return k_configuration(model, engine.accum)


def _k_not_applied(model, loop, site, name: str) -> bool:
    """An engine configured for K > 1 whose windows this loop never counts (ACL306's finding)
    and a loss not divided by K by hand: the raw backward then misses no division, since no
    window sums K losses, and the engine's backward would add one."""
    engine = model.engine_for(name, site.stmt.scope)
    k = engine.accum if engine is not None else None
    if k is None or model.fixed_int(k) == 1 or _divided_by_hand(model, site, name):
        return False
    return not accumulation.windows_counted(model, loop, site)


def _divided_by_hand(model, site, name: str) -> bool:
    flow = model.flow(site)
    return flow is not None and any(_is_engine_k(model, name, d) for d in flow.divisors)


def _what_is_bypassed(model, site, name: str, windowless: bool) -> tuple[str, bool]:
    """What skipping the engine's backward costs in this file, from its K and precision, and
    whether only a DeepSpeed or Megatron-LM launch is hurt."""
    engine = model.engine_for(name, site.stmt.scope)
    k = engine.accum if engine is not None and not windowless else None
    precision = engine.mixed_precision if engine is not None else None
    if engine is not None and engine.node is not None and k is None and precision is None:
        precision = "unknown"
    facts = []
    if k is not None and model.fixed_int(k) != 1:
        n = str(int_value(k)) if int_value(k) is not None else f"`{code(k)}`"
        if _divided_by_hand(model, site, name):
            facts.append(f"the division by {n} is done by hand instead")
        else:
            facts.append(
                f"the gradients of the {n} accumulation steps are summed, not averaged "
                f"({n} times too large)"
            )
    if precision == "fp16":
        facts.append("the fp16 loss is never scaled")
    elif precision in (None, "unknown"):
        facts.append("under fp16 the loss would not be scaled")
    label = "fp32" if precision == "no" else precision
    if len(facts) == 1 and "by hand" in facts[0]:
        facts[0] += f" (right in {label}, but a DeepSpeed engine's backward is skipped)"
        return facts[0], True
    if not facts and windowless:
        return (
            f"the engine's accumulation is not applied in this loop (ACL306) and the run is "
            f"{label}, but a DeepSpeed engine's backward is skipped",
            True,
        )
    if not facts:
        return (
            f"no accumulation or fp16 is configured ({label}), but a DeepSpeed engine's "
            "backward is skipped",
            True,
        )
    return "; ".join(facts), False


def _named_division_edits(ctx, site, engine: str, loss) -> list:
    """Undo `loss = loss / K` / `loss /= K` / `loss = expr / K` written just for this backward.

    Only for the statement right before the backward, in the same block, when the name is not
    read in between: then the engine's own division replaces it and ACL302 has nothing to see.
    """
    if not isinstance(loss, cst.Name):
        return []
    defs = site.stmt.scope.defs_before(loss.value, site.stmt.order)
    if not defs:
        return []
    d = defs[-1]
    stmt = d.stmt
    adjacent = stmt.order == site.stmt.order - 1 and stmt.frames == site.stmt.frames
    if not adjacent or len(stmt.line.body) != 1 or site.stmt.index != 0:
        return []
    model = ctx.model
    if d.op == "/=" and _is_engine_k(model, engine, d.value):
        first, last = ctx.span(stmt.line)[0].line, ctx.span(stmt.line)[1].line
        return [Edit(Position(first, 0), Position(last + 1, 0), "")]
    value = strip_parens(d.value) if d.op == "=" else None
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide):
        if _is_engine_k(model, engine, value.right):
            left = strip_parens(value.left)
            if isinstance(left, cst.Name) and left.value == loss.value:
                first, last = ctx.span(stmt.line)[0].line, ctx.span(stmt.line)[1].line
                return [Edit(Position(first, 0), Position(last + 1, 0), "")]
            return [ctx.replace(d.value, ctx.text(left))]
    return []


def _is_engine_k(model, engine: str, divisor) -> bool:
    """The division the engine's backward repeats: the same judgement as ACL302's, so that
    this fix removes exactly the divisions ACL302 would report after it."""
    return divides_like_engine(model, engine, divisor)


def _without_engine_division(model, engine: str, loss):
    """`loss / K` -> `loss` when K is the engine's own accumulation value (it divides too)."""
    if not (isinstance(loss, cst.BinaryOperation) and isinstance(loss.operator, cst.Divide)):
        return loss
    if _is_engine_k(model, engine, loss.right):
        return strip_parens(loss.left)
    return loss


def _report_scaler(ctx, site, scaler: str) -> None:
    parts = _loss_and_rest(ctx, site)
    fix = None
    if parts is not None:
        loss = parts[0]
        edit = ctx.replace(loss, f"{scaler}.scale({code(strip_parens(loss))})")
        fix = make_fix(f"Scale the loss with `{scaler}.scale(...)`", edit)
    known = ctx.model.setup.scalers.get(scaler)
    when = " when it is enabled" if known is None or known.enabled is None else ""
    ctx.report(
        site.call,
        f"backward of an unscaled loss in a loop that steps `{scaler}`: the fp16 gradients are "
        f"never scaled{when} (use `{scaler}.scale(loss).backward()`)",
        fix,
    )
