"""ACL301's static check (the record and docs: `rules/acl301_missing_loss_division.py`)."""

from __future__ import annotations

import re

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code, dotted, int_value, strip_parens, walk
from linter.model.evaluation import names_a_model
from linter.model.kinds import FlowState, GateKind, RegionKind, SiteKind
from linter.model.loops import same_path
from linter.model.window_sums import decay_rescaled_by_window


def check(ctx: RuleContext) -> None:
    """Report undivided losses in manual accumulation loops (step gated every K micro-steps)."""
    model = ctx.model
    for loop in model.loops:
        for site in loop.of_kind(SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD):
            if _divided_elsewhere_on_its_path(model, loop, site):
                continue
            gate = model.gate_for(loop, site.stmt)
            if not _manual_accumulation(model, gate):
                continue
            if model.regions_around(site.stmt, RegionKind.ACCUMULATE):
                continue
            if model.on_update_step(loop, site.stmt):
                continue
            flow = model.flow(site)
            if flow is None or flow.state != FlowState.UNDIVIDED or _handed_k(flow, gate):
                continue
            if flow.per_sample or decay_rescaled_by_window(model, gate.k) is not None:
                continue  # the window sums its samples on purpose (YOLO's nominal batch)
            _report(ctx, gate, site, flow)


def _divided_elsewhere_on_its_path(model, loop, site) -> bool:
    """An engine backward that divides by K, or a division of the gradients, in an iteration
    that runs this backward; gradients divided by a function the loop calls count too
    (`self._optimizer_step()` calling `self._average_gradients()`), as do those of the loop that
    calls this per-batch function. Another branch (`if fp16: optimizer.backward(loss) else:
    loss.backward()`) does not cover this one."""
    for other in loop.of_kind(SiteKind.ENGINE_BACKWARD):
        if model.divides_by_k(other) and same_path(other.stmt, site.stmt):
            return True
    if any(_may_scale_gradients(model, loop, c, site) for c in loop.scope.calls):
        return True
    return bool(model.reached_sites(loop, site.stmt, SiteKind.GRAD_DIV))


_SCALES_GRADS = re.compile(
    r"(scale|div|normali[sz]e|mul)\w*grad|grad\w*(scale|div|normali[sz]e|mul)"
)


def _may_scale_gradients(model, loop, call, site) -> bool:
    """A call the linter cannot see into, on the update step before the optimizer steps, that
    is handed the model (or its parameters) and a ratio, or is named for scaling gradients:
    torchtune's `training.scale_grads(model, 1 / num_tokens)` divides `.grad` by the window's
    token count. A ratio or the name is required, so `wandb.watch(model)`, `print(model)` or
    `log_metrics(model, step)` hide nothing; clipping, steps and the module's own functions
    (read by `reached_sites`) are known calls, not guesses."""
    stmt = call.stmt
    if model.local_function(call.call.func, stmt.scope) is not None:
        return False
    if any(s.call is call.call for s in loop.sites) or not same_path(stmt, site.stmt):
        return False
    if not any(f.node is loop.node for f in stmt.frames) or not model.on_update_step(loop, stmt):
        return False
    if not any(same_path(s.stmt, stmt) and s.stmt.order > stmt.order for s in loop.steps):
        return False
    values = [a.value for a in call.call.args]
    handed = [v for v in values if _model_or_parameters(model, v)]
    if not handed:
        return False
    named = bool(_SCALES_GRADS.search((call.func or "").rsplit(".", 1)[-1].lower()))
    return named or any(_ratio(model, v, stmt) for v in values if all(v is not h for h in handed))


def _model_or_parameters(model, value) -> bool:
    """`model`, `self._model`, or `model.parameters()`."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in ("parameters", "named_parameters"):
            return True
    text = dotted(value)
    return text is not None and names_a_model(model, text)


def _ratio(model, value, stmt) -> bool:
    """`1 / num_tokens`, `1.0 / n`, or a name bound to such a ratio."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide):
        return True
    text = dotted(value)
    defs = stmt.scope.defs_before(text, stmt.order) if text else []
    return bool(defs) and defs[-1].op == "=" and _ratio(model, defs[-1].value, defs[-1].stmt)


def _handed_k(flow, gate) -> bool:
    """An opaque call given the namespace that holds K (`train_step(batch, args)` with K
    `args.accum`) may read K and divide by it."""
    head = code(gate.k).split(".", 1)[0]
    if head == code(gate.k):
        return False
    return any(dotted(a.value) == head for call in flow.opaque for a in call.args)


def _manual_accumulation(model, gate) -> bool:
    if (
        gate is None
        or gate.k is None
        or gate.kind not in (GateKind.MODULO, GateKind.COUNTER, GateKind.MICRO_LOOP)
    ):
        return False
    value = model.fixed_int(gate.k)
    return value is None or value > 1


def _k_text(k) -> str:
    atoms = (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)
    return code(k) if isinstance(k, atoms) or k.lpar else f"({code(k)})"


def _operand(loss) -> str:
    """The loss as the left operand of `/`, parenthesised when it binds looser."""
    atoms = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)
    return code(loss) if isinstance(loss, atoms) else f"({code(strip_parens(loss))})"


def _report(ctx, gate, site, flow) -> None:
    model = ctx.model
    loss = model.loss_expr(site)
    k = _k_text(gate.k)
    where = ctx.line_of(gate.node)
    notes = [f"accumulation value K = {k} (step gate at line {where})"]
    fix = None
    if not _k_in_scope(gate, site.stmt.scope):
        notes.append(
            f"the step gate is in `{gate.caller.name}`, which calls this function every "
            f"micro-step: `{k}` is not visible here, so no fix is offered"
        )
    elif flow.opaque:
        callee = code(flow.opaque[0].func)
        notes.append(
            f"the loss comes from `{callee}`, which the linter cannot see into: no fix is "
            "offered (if it already averages over the window, or sums on purpose, mark the line "
            "with `# noqa: ACL301`)"
        )
    elif model.names_a_sequence(loss, site.stmt):
        notes.append(
            f"`{code(loss)}` holds several losses: no fix is offered (divide each of them by {k})"
        )
    else:
        fix = make_fix(f"Divide the loss by `{k}`", *_division_edits(ctx, site, loss, k))
    source = f" (from `{code(flow.opaque[0].func)}`)" if flow.opaque else ""
    n = k if int_value(gate.k) is not None else f"`{k}`"
    ctx.report(
        site.call,
        f"`{code(loss)}`{source} is backpropagated undivided while the optimizer steps every "
        f"{n} micro-steps: the window sums {n} losses, so the gradients are {n} times those of "
        "the window's mean loss",
        fix,
        notes=tuple(notes),
        configuration=gate_configuration(model, gate, site.stmt.scope),
    )


def _k_in_scope(gate, scope) -> bool:
    """Whether K, spelled as in the step gate, can be read where the backward is: always for a
    gate of the same function, and for `self.<attr>` from another method of the same class."""
    if gate.caller is None:
        return True
    text = dotted(gate.k) or ""
    same_class = scope.class_name is not None and gate.caller.class_name == scope.class_name
    return same_class and text.startswith("self.")


def _division_edits(ctx, site, loss, k: str) -> list:
    """`loss = loss / K` above the backward, or `(loss / K)` in place when the name is read
    after the backward (a logged loss keeps its meaning); each element of a list or tuple of
    losses (`torch.autograd.backward([l1, l2])`) is divided in place."""
    if isinstance(loss, (cst.List, cst.Tuple)):
        return [ctx.replace(e.value, f"{_operand(e.value)} / {k}") for e in loss.elements]
    if isinstance(loss, cst.Name) and site.stmt.index == 0 and not _read_after(site, loss.value):
        edit = ctx.insert_line_before(site.stmt.line, f"{loss.value} = {loss.value} / {k}")
        if edit is not None:
            return [edit]
    divided = f"{_operand(loss)} / {k}"
    receiver = site.call.func.value if isinstance(site.call.func, cst.Attribute) else None
    wrap = loss is receiver and not loss.lpar  # a parenthesised receiver keeps its own parens
    return [ctx.replace(loss, f"({divided})" if wrap else divided)]


def _read_after(site, name: str) -> bool:
    for stmt in site.stmt.scope.stmts:
        if stmt.order > site.stmt.order:
            if any(isinstance(n, cst.Name) and n.value == name for n in walk(stmt.node)):
                return True
    return False
