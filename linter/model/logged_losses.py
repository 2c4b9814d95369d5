"""Which logged values are a loss divided by K or multiplied by the loss scale (ACL504).

A *logged read* is `.item()` on a name (also through `.detach()`, `.float()`, ...) or a logger
call (`print`, `writer.add_scalar`, `wandb.log`, `logger.info`, `accelerator.log`, a progress
bar's `set_postfix`) whose arguments mention it. Reported:

- at any cadence (every micro-step, on the update step, under `if step % 50 == 0:`, or after a
  micro-step loop in the loop around it), a read of the loss a backward reads after the loop
  divided it by K (`loss = loss / K`, `loss /= K`) or bound it to `scaler.scale(...)`: the value
  is K times too small or S times too large however rarely it is logged; also a loss-named value
  divided by K in a loop whose backward happens inside a helper the linter cannot see
  (`loss_scaler(loss, opt)`);
- as a hint, `.item()` of the undivided loss on every micro-step of a manual accumulation
  window (a device sync each time), also into a running sum (`running += loss.item()`); not
  under a step or log-interval condition, where it runs once per window or less.

Not reported: a value multiplied back by K, a window sum of the divided parts
(`window += loss.item()`, the sum of the `loss / K` of a window is its mean), and the loss of
an engine backward (the engine divides a copy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    code,
    dotted,
    last_part,
    method_call,
    positional,
    strip_parens,
    walk,
)
from linter.model.functions import Def, Scope, Stmt
from linter.model.kinds import FrameKind, GateKind, SiteKind
from linter.model.loops import same_path
from linter.model.losses import accumulates
from linter.model.names import walk_outer

if TYPE_CHECKING:
    from linter.model import Model, Site, TrainingLoop

_K_NAME = re.compile(r"grad(ient)?_?acc|accum", re.I)
_LOGGER_METHODS = {
    "add_scalar",
    "add_scalars",
    "log",
    "log_metrics",
    "log_dict",
    "info",
    "debug",
    "warning",
    "print",
    "set_postfix",
    "set_postfix_str",
    "set_description",
}
_NOT_LOGGERS = ("torch.", "math.", "numpy.", "np.", "scipy.")
_READ_THROUGH = {"detach", "float", "cpu", "mean", "clone", "sum"}
# An `if` that logs only now and then: a modulo, a sync gate, a comparison with a step or
# iteration counter, or a flag named for a step or cadence (`if is_log_step:`). A switch that
# turns logging on (`if wandb_log:`, `if log_writer is not None:`) logs on every micro-step.
_CADENCE_ALWAYS = re.compile(r"%|sync_gradients")
_CADENCE_NAME = re.compile(
    r"(^|_)(steps?|iters?|iterations?|interval|freq|frequency|every)(_|\d|$)", re.I
)
DIVIDED, SCALED, EVERY_MICRO_STEP = "divided", "scaled", "every micro-step"


@dataclass(frozen=True)
class LoggedLoss:
    node: cst.CSTNode  # the logger call, else the `.item()` call
    name: str  # the logged name
    kind: str  # DIVIDED | SCALED | EVERY_MICRO_STEP
    binding: Stmt | None  # where the name was divided or scaled
    k: cst.BaseExpression | None


@dataclass(frozen=True)
class _Window:
    """Where a logged read must sit to run on every micro-step: the loop's body, and the
    training loop it belongs to (None for a loop whose backward the linter cannot see)."""

    scope: Scope
    node: cst.CSTNode
    training: TrainingLoop | None


def logged_losses(model: Model) -> list[LoggedLoss]:
    """Every per-micro-step log of a divided or scaled loss, and the hints, in line order."""
    return model.memo("logged_losses", _find)


def _find(model: Model) -> list[LoggedLoss]:
    found: dict[int, LoggedLoss] = {}
    for loop in model.loops:
        for site in loop.backwards:
            if _engine_divides(model, site):
                continue  # the engine divides a copy; a division on top of it is ACL302's
            for logged in _of_backward(model, loop, site):
                found.setdefault(id(logged.node), logged)
    for logged in _divided_without_backward(model):
        found.setdefault(id(logged.node), logged)
    return sorted(found.values(), key=lambda f: model.line(f.node))


def _engine_divides(model: Model, site: Site) -> bool:
    """An engine backward with a configured K divides a copy of the loss itself: a division
    the loop adds on top is ACL302's finding. With no K, the loop's division is the only one."""
    return site.kind == SiteKind.ENGINE_BACKWARD and (
        model.divides_by_k(site) and model.engine_k() is not None
    )


def _known_ks(model: Model, loop: TrainingLoop | None = None) -> list[cst.BaseExpression]:
    ks = [loop.gate.k] if loop is not None and loop.gate and loop.gate.k is not None else []
    ks += [e.accum for e in model.setup.engines.values() if e.accum is not None]
    return ks


def _of_backward(model: Model, loop: TrainingLoop, site: Site) -> list[LoggedLoss]:
    gate = model.gate_for(loop, site.stmt)
    ks = [gate.k] if gate is not None and gate.k is not None else []
    ks += _known_ks(model)
    name, binding, kind = _backward_name(model, site, ks)
    if name is None:
        return []
    if kind is None:
        manual = (
            site.kind == SiteKind.BACKWARD and gate is not None and gate.kind != GateKind.ACCUMULATE
        )
        if not manual or not accumulates(model, gate):
            return []
        kind = EVERY_MICRO_STEP
    k = gate.k if gate is not None and gate.k is not None else (ks[0] if ks else None)
    if k is None and kind == DIVIDED:  # no gate or engine K in sight: the division's own K
        k = _divisor(site.stmt.scope.defs_before(name, site.stmt.order)[-1])
    after = binding if binding is not None else site.stmt
    if kind == EVERY_MICRO_STEP:
        after = _loss_binding(site, name) or after
    window = _Window(site.stmt.scope, _outermost_loop(after, loop.node, kind), loop)
    return _logged_reads(model, window, name, binding, after, kind, k, ks)


def _divided_without_backward(model: Model) -> list[LoggedLoss]:
    """Loss-named values divided by K in a loop with no visible backward (Swin's
    `loss = loss / ACCUMULATION_STEPS` handed to a scaler helper that runs the backward)."""
    found = []
    ks = _known_ks(model)
    for scope in model.scopes:
        for name, defs in scope.defs.items():
            if "loss" not in last_part(name).lower():
                continue
            for d in defs:
                loops = d.stmt.loops()
                if not loops or not _divides_by_k(model, d, ks) or _is_training(model, loops[-1]):
                    continue
                window = _Window(scope, loops[0], None)
                k = _divisor(d)
                found += _logged_reads(model, window, name, d.stmt, d.stmt, DIVIDED, k, ks)
    return found


def _loss_binding(site: Site, name: str) -> Stmt | None:
    """Where the micro-step's loss is made: an `.item()` between it and the backward
    (`running += loss.item()` before `(loss / K).backward()`) syncs on every micro-step too."""
    defs = site.stmt.scope.defs_before(name, site.stmt.order)
    return defs[-1].stmt if defs else None


def _outermost_loop(after: Stmt, node: cst.CSTNode, kind: str) -> cst.CSTNode:
    """Where a read still sees the divided or scaled value: anywhere in the outermost loop of
    the function around the binding (nanoGPT logs after its micro-step loop). The hint is about
    the training loop's own micro-steps."""
    loops = after.loops()
    return loops[0] if kind != EVERY_MICRO_STEP and loops else node


def _is_training(model: Model, node: cst.CSTNode) -> bool:
    return any(loop.node is node for loop in model.loops)


def _backward_name(model: Model, site: Site, ks) -> tuple[str | None, Stmt | None, str | None]:
    """(the loss name a backward reads, the binding that divided or scaled it, DIVIDED /
    SCALED / None). `(loss / K).backward()` reads `loss` undivided."""
    loss = model.loss_expr(site)
    if loss is None:
        return None, None, None
    loss = strip_parens(loss)
    if isinstance(loss, cst.BinaryOperation) and isinstance(loss.operator, cst.Divide):
        return dotted(loss.left), None, None
    name = dotted(loss)
    if name is None:
        return None, None, None
    defs = site.stmt.scope.defs_before(name, site.stmt.order)
    if not defs or defs[-1].tuple_index is not None:
        return name, None, None
    d = defs[-1]
    if _divides_by_k(model, d, ks):
        return name, d.stmt, DIVIDED
    if d.op == "=" and model.scaled_loss(strip_parens(d.value), d.stmt.scope) is not None:
        return name, d.stmt, SCALED
    return name, None, None


def _divides_by_k(model: Model, d: Def, ks) -> bool:
    divisor = _divisor(d)
    return divisor is not None and _is_k(divisor, ks)


def _divisor(d: Def) -> cst.BaseExpression | None:
    """The divisor of `x = y / D`, `x /= D` or `x = y.div(D)`."""
    if d.op == "/=":
        return d.value
    if d.op != "=" or d.value is None or d.tuple_index is not None:
        return None
    value = strip_parens(d.value)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide):
        return value.right
    pair = method_call(value)
    if pair is not None and pair[1] in ("div", "divide") and positional(value):
        return positional(value)[0]
    return None


def _is_k(node: cst.BaseExpression, ks) -> bool:
    """The accumulation value: named so, or spelled like the step gate's or the engine's K."""
    node = strip_parens(node)
    text = code(node)
    if dotted(node) is not None and _K_NAME.search(last_part(text)):
        return True
    return any(text == code(strip_parens(k)) for k in ks)


def _logged_reads(model, window, name, binding, after, kind, k, ks) -> list[LoggedLoss]:
    found = []
    hint = kind == EVERY_MICRO_STEP
    for stmt in _reading_statements(window, name, after):
        if hint and _only_now_and_then(model, window, stmt):
            continue  # a sync once per window or less is the right place for `.item()`
        if not hint and _sums_a_window(stmt):
            continue
        for node in _reads(model, stmt, name, items_only=kind == EVERY_MICRO_STEP):
            if _multiplied_back(stmt, node, name, ks):
                continue
            if not hint and _derived_multiplied_back(window.scope, stmt, ks):
                continue
            found.append(LoggedLoss(node, name, kind, binding, k))
            break
    return found


def _derived_multiplied_back(scope, stmt: Stmt, ks) -> bool:
    """`batch_loss = loss.item()` and then `batch_loss *= K` (or `batch_loss = batch_loss * K`)
    before it is used: the value kept is the loss again (nanoVLM)."""
    node = stmt.node
    if not isinstance(node, cst.Assign) or len(node.targets) != 1:
        return False
    derived = dotted(node.targets[0].target)
    if derived is None:
        return False
    for later in scope.defs.get(derived, ()):
        if later.stmt.order <= stmt.order:
            continue
        value = later.value
        if value is None:
            continue
        if later.op == "*=" and _is_k(value, ks):
            return True
        if later.op == "=" and _multiplied_back(later.stmt, value, derived, ks):
            return True
    return False


def _reading_statements(window: _Window, name: str, after: Stmt):
    """Statements of the loop after `after` (the binding, or the backward of an undivided loss)
    that may still see that value of `name`: no rebinding in between on their path (a
    rebinding in the other branch of an `if` leaves this branch's value visible)."""
    scope = window.scope
    for stmt in scope.stmts:
        if stmt.order <= after.order or not _in_loop(stmt, window.node):
            continue
        between = [
            d.stmt for d in scope.defs_before(name, stmt.order) if d.stmt.order > after.order
        ]
        if not any(same_path(d, after) and same_path(d, stmt) for d in between):
            yield stmt


def _in_loop(stmt: Stmt, node: cst.CSTNode) -> bool:
    return node is stmt.scope.node or any(f.node is node for f in stmt.frames)


def _only_now_and_then(model: Model, window: _Window, stmt: Stmt) -> bool:
    """`.item()` on the update step or under a log-interval condition (`if step % 100 == 0:`,
    `if global_step % args.logging_steps == 0:`) does not sync on every micro-step."""
    if window.training is not None and model.on_update_step(window.training, stmt):
        return True
    return any(
        frame.kind in (FrameKind.IF, FrameKind.EXIT) and _is_cadence(frame.test)
        for frame in stmt.frames_inside(window.node)
    )


def _is_cadence(test: cst.BaseExpression) -> bool:
    if _CADENCE_ALWAYS.search(code(test)):
        return True
    for sub in walk(test):
        if isinstance(sub, cst.Comparison) and any(_counts(n) for n in walk(sub)):
            return True
        if isinstance(sub, (cst.Name, cst.Attribute)) and _is_flag(test, sub) and _counts(sub):
            return True
    return False


def _counts(node: cst.CSTNode) -> bool:
    """A name for a step, an iteration or a cadence (`global_step`, `iter_num`, `log_every`)."""
    if isinstance(node, cst.Attribute):
        node = node.attr
    return isinstance(node, cst.Name) and bool(_CADENCE_NAME.search(node.value))


def _is_flag(test: cst.BaseExpression, node: cst.CSTNode) -> bool:
    """`node` is the whole test or an operand of `and`/`or`/`not`, not part of a comparison."""
    test = strip_parens(test)
    if test is node:
        return True
    if isinstance(test, cst.BooleanOperation):
        return _is_flag(test.left, node) or _is_flag(test.right, node)
    if isinstance(test, cst.UnaryOperation):
        return _is_flag(test.expression, node)
    return False


def _sums_a_window(stmt: Stmt) -> bool:
    """`window += loss.item()` or `total = total + loss.detach()`: a sum over the window, whose
    parts may be divided by K on purpose (the sum of the `loss / K` is the window's mean)."""
    node = stmt.node
    if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign):
        return True
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        target = dotted(node.targets[0].target)
        value = strip_parens(node.value)
        if target is not None and isinstance(value, cst.BinaryOperation):
            return isinstance(value.operator, cst.Add) and dotted(value.left) == target
    return False


def _reads(model: Model, stmt: Stmt, name: str, items_only: bool):
    """The logger calls reading `name`, then the `.item()` calls on it outside any logger."""
    inside_loggers: set[int] = set()
    for sub in walk_outer(stmt.node, name):
        if isinstance(sub, cst.Call) and _is_logger(model, sub, name):
            args = [a.value for a in sub.args]
            if any(_refers(arg, name, items_only) for arg in args):
                inside_loggers.update(id(n) for arg in args for n in walk(arg))
                yield sub
    for sub in walk_outer(stmt.node, name):
        if id(sub) not in inside_loggers and _item_of(sub, name):
            yield sub


def _is_logger(model: Model, call: cst.Call, name: str) -> bool:
    text = dotted(call.func) or ""
    if text in ("print", "tqdm.write"):
        return True
    pair = method_call(call)
    if pair is None or pair[1] not in _LOGGER_METHODS or dotted(pair[0]) == name:
        return False
    qual = model.imports.qualify(call.func) or text
    return not qual.startswith(_NOT_LOGGERS)


def _refers(arg, name: str, items_only: bool) -> bool:
    for sub in walk_outer(arg, name):
        if items_only and _item_of(sub, name):
            return True
        if not items_only and dotted(sub) == name:
            return True
    return False


def _item_of(node, name: str) -> bool:
    """`name.item()`, also through `.detach()`, `.float()`, `.cpu()`, `.mean()`."""
    pair = method_call(node)
    if pair is None or pair[1] != "item":
        return False
    receiver = strip_parens(pair[0])
    while (inner := method_call(receiver)) is not None and inner[1] in _READ_THROUGH:
        receiver = strip_parens(inner[0])
    return dotted(receiver) == name


def _multiplied_back(stmt: Stmt, read: cst.CSTNode, name: str, ks) -> bool:
    """`loss.item() * K`, or `print((loss * K).item())`, in the logging statement: the loss
    again, not its K-th part."""
    for sub in walk(stmt.node):
        if isinstance(sub, cst.BinaryOperation) and isinstance(sub.operator, cst.Multiply):
            for side, other in ((sub.left, sub.right), (sub.right, sub.left)):
                if not _is_k(other, ks):
                    continue
                if _contains(side, read) or (_contains(read, sub) and _mentions(side, name)):
                    return True
    return False


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return any(dotted(n) == name for n in walk(node))


def _contains(outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    return any(n is inner for n in walk(outer))


def describe(model: Model, loop: TrainingLoop) -> list[dict]:
    """`--show-loops`: the per-micro-step logs of this loop that read a divided or scaled loss."""
    return [
        {"name": logged.name, "kind": logged.kind, "line": model.line(logged.node)}
        for logged in logged_losses(model)
        if any(f.node is loop.node for f in _frames_of(logged, model))
    ]


def _frames_of(logged: LoggedLoss, model: Model):
    for scope in model.scopes:
        for stmt in scope.stmts:
            if any(n is logged.node for n in walk(stmt.node)):
                return stmt.frames
    return ()
