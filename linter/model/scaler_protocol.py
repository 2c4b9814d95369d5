"""The GradScaler protocol: which scaler scaled each backward, and what every stepping path does.

torch's GradScaler accepts one order per iteration: `scaler.scale(loss).backward()`, then
`scaler.unscale_(opt)` before anything reads the gradients (a clip), `scaler.step(opt)` for each
optimizer, and one `scaler.update()`. ACL102-ACL104 ask where a path leaves that order; the
answers live here, in the model's terms (sites, statements, paths), so the rules stay short.

A *body* is what runs as one iteration: a training loop, a loop whose scaled backward runs in a
module function it calls, or a function holding a scaled backward that no training loop owns (a
timm-style `NativeScaler.__call__` wrapper). ACL103's update questions are in `scaler_updates.py`,
ACL104's clip questions in `scaler_clipping.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.classes import STEP_KINDS_AT_CALL, inlined_callee
from linter.model.cst_util import (
    code,
    dotted,
    last_part,
    method_call,
    positional,
    strip_parens,
    walk,
)
from linter.model.depths import FOLLOW_DEPTH, METHOD_CALL_DEPTH
from linter.model.functions import Scope, Stmt
from linter.model.kinds import FrameKind, ScalerRole, SiteKind
from linter.model.loops import STEP_KINDS, Site, same_path

if TYPE_CHECKING:
    from linter.model import Model

# `scaler.step` unscales what `unscale_` has not
UNSCALING = (SiteKind.UNSCALE, SiteKind.SCALER_STEP)


@dataclass(eq=False)
class Body:
    node: cst.CSTNode  # the loop, or the function
    scope: Scope
    sites: list[Site]
    repeats: bool  # a loop (or a per-batch function); False for a wrapper no loop owns

    def contains(self, stmt: Stmt) -> bool:
        return stmt.scope is self.scope and (
            self.node is self.scope.node or any(f.node is self.node for f in stmt.frames)
        )

    def conditions(self, stmt: Stmt) -> frozenset[tuple[str, bool]]:
        """The tests of the `if` branches and early exits inside the body that `stmt` needs, by
        text: `if amp: scaler.scale(loss).backward()` ... `if amp: scaler.unscale_(opt)` is one
        condition written twice."""
        return conditions_of(stmt, self.node)

    def runs_whenever(self, a: Stmt, b: Stmt) -> bool:
        """Whether `a` runs in every iteration in which `b` runs (no extra condition)."""
        return self.conditions(a) <= self.conditions(b)


def conditions_of(stmt: Stmt, inside: cst.CSTNode) -> frozenset[tuple[str, bool]]:
    frames = stmt.frames_inside(inside)
    return frozenset(
        (code(f.test), f.holds) for f in frames if f.kind in (FrameKind.IF, FrameKind.EXIT)
    )


@dataclass(eq=False)
class ScaledBackward:
    site: Site  # for a helper, a "backward" site standing for the call of it
    scaler: str  # the scaler's expression (`scaler`, `self.scaler`), as the body names it
    via_helper: bool = False
    # What the helper's own backward needs (`if self.use_amp:` inside `training_step`).
    conditions: frozenset[tuple[str, bool]] = frozenset()


@dataclass(eq=False)
class Bypass:
    """`opt.step()` fed by a scaled backward, with no `scaler.step(opt)` in the body (ACL102)."""

    site: Site
    body: Body
    scaled: ScaledBackward


# bodies ------------------------------------------------------------------------------------------
def bodies(model: Model) -> list[Body]:
    return model.memo("scaler_protocol.bodies", _find_bodies)


def _find_bodies(model: Model) -> list[Body]:
    found = [Body(loop.node, loop.scope, loop.sites, True) for loop in model.loops]
    owned = {id(s) for loop in model.loops for s in loop.sites}
    for scope in model.scopes:
        sites = model.sites[id(scope)]
        if not isinstance(scope.node, cst.FunctionDef):
            continue
        loose = [s for s in sites if s.kind == SiteKind.BACKWARD and id(s) not in owned]
        if any(scaler_of_backward(model, s) for s in loose):
            found.append(Body(scope.node, scope, sites, False))
    return found + _helper_loops(model, {id(b.node) for b in found})


def _helper_loops(model: Model, known: set[int]) -> list[Body]:
    """Loops whose scaled backward runs in a module function they call (`self.training_step()`),
    so that they hold no backward of their own and are no training loop of the model."""
    found = []
    for call in model.calls:
        loops = call.stmt.loops()
        if not loops or id(loops[-1]) in known or _helper_scaler(model, call) is None:
            continue
        known.add(id(loops[-1]))
        scope = call.stmt.scope
        body = Body(loops[-1], scope, [], True)
        body.sites = [s for s in model.sites[id(scope)] if body.contains(s.stmt)]
        found.append(body)
    return found


# which scaler scaled a backward -------------------------------------------------------------------
def scaler_of_backward(model: Model, site: Site) -> str | None:
    """The enabled (or runtime-decided) scaler whose `scale(...)` the backward starts from:
    `scaler.scale(loss).backward()`, `torch.autograd.backward(scaler.scale(loss))`, or a name
    bound to one. A literal `enabled=False` scaler scales nothing, so it answers None."""
    if site.kind != SiteKind.BACKWARD or site.call is None:
        return None
    scaler = site.scaler  # a loss scaler's call (`loss_scaler(loss, optimizer)`) names it
    if scaler is None:
        start = _backward_start(model, site.call)
        if start is None:
            return None
        scaler = _scaler_of_value(model, start, site.stmt.scope, site.stmt.order, 0)
    if scaler is None or model.scaler_role(scaler, site.stmt.scope) == ScalerRole.DISABLED:
        return None
    return scaler


def _backward_start(model: Model, call: cst.Call) -> cst.BaseExpression | None:
    """The tensor a backward call starts from: `X` of `X.backward()` or of
    `torch.autograd.backward(X)`."""
    if model.is_backward_function(call):
        args = positional(call)
        return args[0] if args else None
    return call.func.value if isinstance(call.func, cst.Attribute) else None


def _scaler_of_value(model: Model, value, scope: Scope, order: int, depth: int) -> str | None:
    if depth > FOLLOW_DEPTH:
        return None
    value = strip_parens(value)
    pair = method_call(value)
    if pair is not None and pair[1] == "scale" and positional(value):
        receiver = dotted(pair[0])
        if receiver and (model.scaler_role(receiver, scope) or "scal" in receiver.lower()):
            return receiver
        return None
    if isinstance(value, cst.BinaryOperation):
        sides = (value.left, value.right)
    elif isinstance(value, cst.IfExp):  # `scaler.scale(loss) if amp else loss`
        sides = (value.body, value.orelse)
    else:
        sides = ()
    for side in sides:
        found = _scaler_of_value(model, side, scope, order, depth + 1)
        if found:
            return found
    text = dotted(value)
    defs = scope.defs_before(text, order) if text else []
    if not defs or defs[-1].tuple_index is not None:
        return None
    last = defs[-1]
    if last.op != "=":  # `scaled /= K` keeps what `scaled` held
        return _scaler_of_value(model, value, scope, last.stmt.order, depth + 1)
    return _scaler_of_value(model, last.value, scope, last.stmt.order, depth + 1)


def scaled_backwards(model: Model, body: Body) -> list[ScaledBackward]:
    """The body's scaled backwards, its own and those of the module functions it calls."""
    return model.memo(f"scaler_protocol.scaled.{id(body)}", lambda m: _scaled(m, body))


def _scaled(model: Model, body: Body) -> list[ScaledBackward]:
    found = []
    for site in body.sites:
        scaler = scaler_of_backward(model, site)
        if scaler is not None:
            found.append(ScaledBackward(site, scaler))
    for call in body.scope.calls:
        if body.contains(call.stmt):
            helper = _helper_scaler(model, call)
            if helper is not None:
                scaler, inner = helper
                site = Site(SiteKind.BACKWARD, call.call, call.stmt)
                found.append(ScaledBackward(site, scaler, True, inner))
    return sorted(found, key=lambda sb: sb.site.stmt.order)


def _helper_scaler(model: Model, call) -> tuple[str, frozenset] | None:
    """The scaler, as the caller names it, of a module function that only runs a scaled backward
    (`self.training_step(batch)` doing `self.scaler.scale(loss).backward()`). A function that
    also unscales or steps keeps the protocol to itself, and is judged as its own body."""
    callee = model.local_function(call.call.func, call.stmt.scope)
    if callee is None or callee is call.stmt.scope:
        return None
    sites = model.sites[id(callee)]
    if any(s.kind in (*UNSCALING, SiteKind.OPT_STEP, SiteKind.SCALER_UPDATE) for s in sites):
        return None
    for site in sites:
        scaler = scaler_of_backward(model, site)
        if scaler is None:
            continue
        named = _as_the_caller_names(model, callee, call, scaler)
        return (named, conditions_of(site.stmt, callee.node)) if named else None
    return None


def _as_the_caller_names(model: Model, callee: Scope, call, scaler: str) -> str | None:
    """`self.scaler` in a method of the caller's class, a module-level name, or what the call
    passes for the parameter (`backward(loss, amp_scaler)` for `def backward(loss, scaler)`)."""
    head = scaler.split(".", 1)[0]
    if head == "self":
        return scaler if callee.class_name == call.stmt.scope.class_name else None
    if head not in callee.params:
        return scaler if head not in callee.defs else None
    passed = _argument(callee, call.call, head)
    name = dotted(passed) if passed is not None else None
    if name and model.scaler_role(name, call.stmt.scope) != ScalerRole.DISABLED:
        return name + scaler[len(head) :]
    return None


def _argument(callee: Scope, call: cst.Call, param: str) -> cst.BaseExpression | None:
    """What `call` passes for `param` of the function `callee`."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == param:
            return arg.value
    names = list(callee.params)
    if callee.class_name is not None and names and names[0] in ("self", "cls"):
        names = names[1:]
    positional_args = [a.value for a in call.args if a.keyword is None and not a.star]
    index = names.index(param)
    return positional_args[index] if index < len(positional_args) else None


# same-module helpers the body calls ---------------------------------------------------------------
def helper_calls(model: Model, body: Body) -> list[tuple[Stmt, set[str]]]:
    """(the calling statement, the site kinds the called function holds) for each call in the body
    of a module function or method of the same class (`self.optimizer_step()`), nested helpers
    included: a step or update there counts at the call."""
    return model.memo(f"scaler_protocol.helpers.{id(body)}", lambda m: _helper_calls(m, body))


def _helper_calls(model: Model, body: Body) -> list[tuple[Stmt, set[str]]]:
    found = []
    for call in body.scope.calls:
        if not body.contains(call.stmt):
            continue
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is not None and callee is not body.scope:
            kinds = _kinds_of(model, callee, 0, set())
            if inlined_callee(model.graph, call) is not None:
                kinds -= STEP_KINDS_AT_CALL  # already the body's sites, in the method's order
            found.append((call.stmt, kinds))
    return found


def _kinds_of(model: Model, scope: Scope, depth: int, seen: set[int]) -> set[str]:
    seen.add(id(scope))
    kinds = {s.kind for s in model.sites[id(scope)]}
    if depth + 1 >= METHOD_CALL_DEPTH:  # the helper itself is the first level
        return kinds
    for call in scope.calls:
        callee = model.local_function(call.call.func, scope)
        if callee is not None and id(callee) not in seen:
            kinds |= _kinds_of(model, callee, depth + 1, seen)
    return kinds


def helper_stmts(model: Model, body: Body, *kinds: str) -> list[Stmt]:
    return [stmt for stmt, held in helper_calls(model, body) if held & set(kinds)]


# ACL102: optimizer steps that bypass the scaler ---------------------------------------------------
def bypassing_steps(model: Model, body: Body) -> list[Bypass]:
    return model.memo(f"scaler_protocol.bypass.{id(body)}", lambda m: _bypasses(m, body))


def _bypasses(model: Model, body: Body) -> list[Bypass]:
    scaled = scaled_backwards(model, body)
    if not scaled:
        return []
    found = []
    for site in body.sites:
        if site.kind != SiteKind.OPT_STEP or _stepped_by_scaler(model, body, site):
            continue
        if model.is_prepared(site.receiver, site.stmt.scope, site.stmt.order):
            continue  # an AcceleratedOptimizer / engine optimizer calls the scaler itself
        if _wraps_a_scaler(model, site):
            continue
        feeding = [s for s in _feeding(body, site, scaled) if _may_reach(model, s, site)]
        if feeding:
            found.append(Bypass(site, body, feeding[-1]))
    return found


def _wraps_a_scaler(model: Model, step: Site) -> bool:
    """`optim_wrapper.step()` on an instance of a module class whose own `step` method steps
    through a scaler (an AMP optimizer wrapper, as mmengine writes one)."""
    classes = model.memo("scaler_protocol.scaler_classes", _scaler_step_classes)
    text = step.receiver or ""
    defs = step.stmt.scope.defs.get(text) or model.module_defs(text)
    for d in defs:
        if d.op == "=" and isinstance(d.value, cst.Call):
            if last_part(dotted(d.value.func)) in classes:
                return True
    return False


def _scaler_step_classes(model: Model) -> set[str]:
    return {
        scope.class_name
        for scope in model.function_defs.get("step", ())
        if scope.class_name and any(s.kind == SiteKind.SCALER_STEP for s in model.sites[id(scope)])
    }


def _stepped_by_scaler(model: Model, body: Body, step: Site) -> bool:
    """`scaler.step(<this optimizer>)` somewhere in the body, or a same-module helper in it that
    steps through a scaler (`self.optimizer_step()` doing `self.scaler.step(self.optimizer)`)."""
    for site in body.sites:
        if site.kind == SiteKind.SCALER_STEP and site.call is not None and positional(site.call):
            if code(positional(site.call)[0]) == step.receiver:
                return True
    return bool(helper_stmts(model, body, SiteKind.SCALER_STEP))


def _feeding(body: Body, step: Site, scaled: list[ScaledBackward]) -> list[ScaledBackward]:
    """The scaled backwards whose gradients this step applies: those since the previous step on
    its path (all of the path's, when it is the first step: they come from the last iteration),
    unless an unscaled backward is the one right before the step (a second, fp32 model)."""
    sites = sorted(body.sites + [sb.site for sb in scaled if sb.via_helper], key=_order)
    path = [s for s in sites if same_path(s.stmt, step.stmt)]
    before = [s for s in path if s.stmt.order < step.stmt.order]
    since = []
    for s in reversed(before):
        if s.kind in STEP_KINDS:
            break
        since.append(s)
    backwards = [
        s for s in reversed(since) if s.kind in (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD)
    ]
    if not backwards:
        backwards = [s for s in path if s.kind in (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD)]
    by_site = {id(sb.site): sb for sb in scaled}
    if backwards and id(backwards[-1]) not in by_site:
        return []
    return [by_site[id(s)] for s in backwards if id(s) in by_site]


def _order(site: Site) -> int:
    return site.stmt.order


def _may_reach(model: Model, scaled: ScaledBackward, step: Site) -> bool:
    """False when the optimizer visibly trains other models than the scaled loss comes from."""
    trained = optimizer_models(model, step.receiver)
    flow = None if scaled.via_helper else model.flow(scaled.site)
    if not trained or flow is None or not flow.models:
        return True
    return any(_related(a, b) for a in trained for b in flow.models)


def _related(a: str, b: str) -> bool:
    """`model` and `self.model` (an `__init__` building from its argument), `model.module`."""
    a, b = a.removeprefix("self."), b.removeprefix("self.")
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def optimizer_models(model: Model, text: str | None) -> set[str]:
    """The models whose parameters an optimizer was built from (`SGD(net.parameters())`)."""
    built = model.setup.optimizers.get(text or "")
    if not isinstance(built, cst.Call) or not built.args:
        return set()
    found = set()
    for node in walk(built.args[0].value):
        pair = method_call(node)
        if pair is not None and pair[1] in ("parameters", "named_parameters"):
            name = dotted(pair[0])
            if name is None:
                return set()
            found.add(name)
    return found


# --show-loops -----------------------------------------------------------------------------------
def describe(model: Model, node: cst.CSTNode, covering_update) -> dict | None:
    """What the scaler rules understood about the body of a loop: its scaled backwards, the
    scaler steps and whether an update follows each in every iteration (`covering_update`, from
    `scaler_updates`, which builds on this module), its unscales, and the optimizer steps that
    bypass the scaler."""
    body = next((b for b in bodies(model) if b.node is node), None)
    if body is None or not (scaled_backwards(model, body) or _scaler_sites(body)):
        return None
    line = model.line
    steps = [s for s in body.sites if s.kind == SiteKind.SCALER_STEP and s.call is not None]
    return {
        "scaled_backwards": [
            {"line": line(sb.site.call), "scaler": sb.scaler, "through_function": sb.via_helper}
            for sb in scaled_backwards(model, body)
        ],
        "scaler_steps": [
            {
                "line": line(s.call),
                "code": code(s.call),
                "updated_every_iteration": covering_update(model, body, s.stmt, s.receiver or "")
                is not None,
            }
            for s in steps
        ],
        "unscales": [{"line": line(s.call), "code": code(s.call)} for s in _unscales(body)],
        "steps_bypassing_the_scaler": [
            {"line": line(b.site.call), "code": code(b.site.call), "scaler": b.scaled.scaler}
            for b in bypassing_steps(model, body)
        ],
    }


def _scaler_sites(body: Body) -> list[Site]:
    return [
        s
        for s in body.sites
        if s.kind in (SiteKind.SCALER_STEP, SiteKind.SCALER_UPDATE, SiteKind.UNSCALE)
    ]


def _unscales(body: Body) -> list[Site]:
    return [s for s in body.sites if s.kind == SiteKind.UNSCALE and s.call is not None]
