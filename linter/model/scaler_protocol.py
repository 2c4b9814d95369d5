"""The GradScaler protocol: which scaler scaled each backward, and what every stepping path does.

torch's GradScaler accepts one order per iteration: `scaler.scale(loss).backward()`, then
`scaler.unscale_(opt)` before anything reads the gradients (a clip), `scaler.step(opt)` for each
optimizer, and one `scaler.update()`. ACL102-ACL104 ask where a path leaves that order; the
answers live here, in the model's terms (sites, statements, paths), so the rules stay short.

A *body* is what runs as one iteration: a training loop, or a function holding a scaled backward
that no training loop owns (a timm-style `NativeScaler.__call__` wrapper).
"""

from __future__ import annotations

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
from linter.model.functions import Scope, Stmt
from linter.model.loops import STEP_KINDS, Site, TrainingLoop, same_path

if TYPE_CHECKING:
    from linter.model import Model

_MAX_DEPTH = 4
_CLIP_NAMES = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"}
_UNSCALING = ("unscale", "scaler_step")  # `scaler.step` unscales what `unscale_` has not


@dataclass(eq=False)
class Body:
    node: cst.CSTNode  # the loop, or the function
    scope: Scope
    sites: list[Site]
    loop: TrainingLoop | None  # None for a function no training loop owns

    def contains(self, stmt: Stmt) -> bool:
        return stmt.scope is self.scope and (
            self.node is self.scope.node or any(f.node is self.node for f in stmt.frames)
        )

    def conditions(self, stmt: Stmt) -> frozenset[tuple[int, bool]]:
        """The `if` branches and early exits inside the body that must hold for `stmt` to run."""
        frames = stmt.frames_inside(self.node)
        return frozenset((id(f.node), f.holds) for f in frames if f.kind in ("if", "exit"))

    def runs_whenever(self, a: Stmt, b: Stmt) -> bool:
        """Whether `a` runs in every iteration in which `b` runs (no extra condition)."""
        return self.conditions(a) <= self.conditions(b)


@dataclass(eq=False)
class ScaledBackward:
    site: Site
    scaler: str  # the scaler's expression (`scaler`, `self.scaler`)


@dataclass(eq=False)
class Bypass:
    """`opt.step()` fed by a scaled backward, with no `scaler.step(opt)` in the body (ACL102)."""

    site: Site
    body: Body
    scaled: ScaledBackward


@dataclass(eq=False)
class ScaledClip:
    """A torch clip reached from a scaled backward with nothing unscaling in between (ACL104)."""

    site: Site
    body: Body
    scaled: ScaledBackward


# bodies ------------------------------------------------------------------------------------------
def bodies(model: Model) -> list[Body]:
    return model.memo("scaler_protocol.bodies", _find_bodies)


def _find_bodies(model: Model) -> list[Body]:
    found = [Body(loop.node, loop.scope, loop.sites, loop) for loop in model.loops]
    owned = {id(s) for loop in model.loops for s in loop.sites}
    for scope in model.scopes:
        sites = model.sites[id(scope)]
        if not isinstance(scope.node, cst.FunctionDef):
            continue
        loose = [s for s in sites if s.kind == "backward" and id(s) not in owned]
        if any(scaler_of_backward(model, s) for s in loose):
            found.append(Body(scope.node, scope, sites, None))
    return found


# which scaler scaled a backward -------------------------------------------------------------------
def scaler_of_backward(model: Model, site: Site) -> str | None:
    """The enabled (or runtime-decided) scaler whose `scale(...)` the backward starts from:
    `scaler.scale(loss).backward()`, `torch.autograd.backward(scaler.scale(loss))`, or a name
    bound to one. A literal `enabled=False` scaler scales nothing, so it answers None."""
    if site.kind != "backward" or site.call is None:
        return None
    call = site.call
    if model.is_backward_function(call):
        args = positional(call)
        start = args[0] if args else None
    elif isinstance(call.func, cst.Attribute):
        start = call.func.value
    else:
        return None
    if start is None:
        return None
    scaler = _scaler_of_value(model, start, site.stmt.scope, site.stmt.order, 0)
    if scaler is None or model.scaler_role(scaler, site.stmt.scope) == "disabled":
        return None
    return scaler


def _scaler_of_value(model: Model, value, scope: Scope, order: int, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
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
    found = []
    for site in body.sites:
        scaler = scaler_of_backward(model, site)
        if scaler is not None:
            found.append(ScaledBackward(site, scaler))
    return found


# same-module helpers the body calls ---------------------------------------------------------------
def helper_calls(model: Model, body: Body) -> list[tuple[Stmt, set[str]]]:
    """(the calling statement, the site kinds the called function holds) for each call in the body
    of a module function or method of the same class (`self.optimizer_step()`), nested helpers
    included: a step or update there counts at the call."""
    found = []
    for call in body.scope.calls:
        if not body.contains(call.stmt):
            continue
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is not None and callee is not body.scope:
            found.append((call.stmt, _kinds_of(model, callee, 0, set())))
    return found


def _kinds_of(model: Model, scope: Scope, depth: int, seen: set[int]) -> set[str]:
    seen.add(id(scope))
    kinds = {s.kind for s in model.sites[id(scope)]}
    if depth >= 2:
        return kinds
    for call in scope.calls:
        callee = model.local_function(call.call.func, scope)
        if callee is not None and id(callee) not in seen:
            kinds |= _kinds_of(model, callee, depth + 1, seen)
    return kinds


def _helper_stmts(model: Model, body: Body, *kinds: str) -> list[Stmt]:
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
        if site.kind != "opt_step" or _stepped_by_scaler(model, body, site):
            continue
        if model.is_prepared(site.receiver, site.stmt.scope, site.stmt.order):
            continue  # an AcceleratedOptimizer / engine optimizer calls the scaler itself
        feeding = [s for s in _feeding(body, site, scaled) if _may_reach(model, s, site)]
        if feeding:
            found.append(Bypass(site, body, feeding[-1]))
    return found


def _stepped_by_scaler(model: Model, body: Body, step: Site) -> bool:
    """`scaler.step(<this optimizer>)` somewhere in the body, or a same-module helper in it that
    steps through a scaler (`self.optimizer_step()` doing `self.scaler.step(self.optimizer)`)."""
    for site in body.sites:
        if site.kind == "scaler_step" and site.call is not None and positional(site.call):
            if code(positional(site.call)[0]) == step.receiver:
                return True
    return bool(_helper_stmts(model, body, "scaler_step"))


def _feeding(body: Body, step: Site, scaled: list[ScaledBackward]) -> list[ScaledBackward]:
    """The scaled backwards whose gradients this step applies: those since the previous step on
    its path (all of the path's, when it is the first step: they come from the last iteration),
    unless an unscaled backward is the one right before the step (a second, fp32 model)."""
    path = [s for s in body.sites if same_path(s.stmt, step.stmt)]
    before = [s for s in path if s.stmt.order < step.stmt.order]
    since = []
    for s in reversed(before):
        if s.kind in STEP_KINDS:
            break
        since.append(s)
    backwards = [s for s in reversed(since) if s.kind in ("backward", "engine_backward")]
    if not backwards:
        backwards = [s for s in path if s.kind in ("backward", "engine_backward")]
    by_site = {id(sb.site): sb for sb in scaled}
    if backwards and id(backwards[-1]) not in by_site:
        return []
    return [by_site[id(s)] for s in backwards if id(s) in by_site]


def _may_reach(model: Model, scaled: ScaledBackward, step: Site) -> bool:
    """False when the optimizer visibly trains other models than the scaled loss comes from."""
    trained = optimizer_models(model, step.receiver)
    flow = model.flow(scaled.site)
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


# ACL103 and the update the fixes insert -----------------------------------------------------------
def stepping_stmts(model: Model, body: Body, scaler: str) -> list[Stmt]:
    """The statements that step through `scaler`: its `scaler.step(...)` calls and the direct
    `opt.step()` calls that ACL102 turns into `scaler.step(opt)`."""
    stmts = [s.stmt for s in body.sites if s.kind == "scaler_step" and s.receiver == scaler]
    stmts += [b.site.stmt for b in bypassing_steps(model, body) if b.scaled.scaler == scaler]
    return sorted(stmts, key=lambda s: s.order)


def update_anchor(model: Model, body: Body, scaler: str, stmt: Stmt) -> Stmt:
    """Where an `update()` for a step at `stmt` belongs: after the last step of the same scaler
    that follows it on its path and runs whenever it does (one update after a GAN's two steps).
    ACL102 and ACL103 both insert here, so that their fixes meet and only one update is added."""
    anchor = stmt
    for other in stepping_stmts(model, body, scaler):
        if (
            other.order > anchor.order
            and same_path(other, stmt)
            and body.runs_whenever(other, stmt)
        ):
            anchor = other
    return anchor


def updates(model: Model, body: Body, scaler: str) -> list[Stmt]:
    """The statements that update `scaler`: its `update()` calls and calls of module helpers
    that update a scaler."""
    own = [s.stmt for s in body.sites if s.kind == "scaler_update" and s.receiver == scaler]
    return own + _helper_stmts(model, body, "scaler_update")


def covering_update(model: Model, body: Body, step: Stmt, scaler: str) -> Stmt | None:
    """An update after `step` that runs in every iteration that steps."""
    for update in updates(model, body, scaler):
        if update.order > step.order and same_path(update, step):
            if body.runs_whenever(update, step):
                return update
    return None


@dataclass(eq=False)
class MissingUpdate:
    """Scaler steps of one path with no update after them in every iteration that steps."""

    body: Body
    scaler: str
    steps: list[Site]
    anchor: Stmt  # the update goes right after this statement
    partial: list[Stmt]  # updates that run on some of these iterations only (a logging branch)


def missing_updates(model: Model, body: Body) -> list[MissingUpdate]:
    groups: dict[int, MissingUpdate] = {}
    for site in body.sites:
        if site.kind != "scaler_step" or not site.receiver or site.call is None:
            continue
        if model.scaler_role(site.receiver, site.stmt.scope) == "disabled":
            continue
        args = positional(site.call)
        if args and model.is_prepared(dotted(args[0]), site.stmt.scope, site.stmt.order):
            continue  # the engine's optimizer updates the scaler itself
        if covering_update(model, body, site.stmt, site.receiver) is not None:
            continue
        if body.loop is None and _updated_anywhere(model, site.receiver):
            continue  # a wrapper's caller may update through another method
        anchor = update_anchor(model, body, site.receiver, site.stmt)
        group = groups.get(id(anchor))
        if group is None:
            partial = _partial_updates(model, body, site.receiver, anchor)
            group = groups[id(anchor)] = MissingUpdate(body, site.receiver, [], anchor, partial)
        group.steps.append(site)
    return list(groups.values())


def _partial_updates(model: Model, body: Body, scaler: str, anchor: Stmt) -> list[Stmt]:
    """The updates an inserted per-step `update()` replaces: those of the body that run on some
    iterations only, and those after the loop (once per epoch). Left in place, each would run
    a second time with no step recorded since the first, which torch rejects."""
    found = []
    for site in model.sites[id(body.scope)]:
        if site.kind != "scaler_update" or site.receiver != scaler:
            continue
        if body.contains(site.stmt):
            if same_path(site.stmt, anchor):
                found.append(site.stmt)
        elif site.stmt.order > anchor.order and _encloses(anchor, site.stmt):
            found.append(site.stmt)
    return found


def _encloses(inner: Stmt, outer: Stmt) -> bool:
    """Whether every loop around `outer` is also around `inner` (not another loop's update)."""
    around = {id(node) for node in inner.loops()}
    return all(id(node) in around for node in outer.loops())


def _updated_anywhere(model: Model, scaler: str) -> bool:
    return any(
        s.kind == "scaler_update" and s.receiver == scaler
        for sites in model.sites.values()
        for s in sites
    )


def has_update(model: Model, body: Body, scaler: str) -> bool:
    return bool(updates(model, body, scaler))


# ACL104: clips of still-scaled gradients ---------------------------------------------------------
def is_torch_clip(model: Model, site: Site) -> bool:
    """`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_` under any import spelling; not an
    engine's or a module's own `clip_grad_norm_` method (which unscale or shard themselves)."""
    if site.kind != "clip" or site.call is None:
        return False
    func = site.call.func
    qual = model.imports.qualify(func) or ""
    if last_part(qual) not in _CLIP_NAMES:
        return False
    if qual.startswith("torch.nn.utils."):
        return True
    return isinstance(func, cst.Name) and model.local_function(func, site.stmt.scope) is None


def unscaled_clips(model: Model, body: Body) -> list[ScaledClip]:
    """Torch clips after a scaled backward on their path with no `unscale_` (or `scaler.step`, or
    a helper doing either) between the two, on every way from one to the other."""
    scaled = scaled_backwards(model, body)
    if not scaled:
        return []
    unscaling = [s.stmt for s in body.sites if s.kind in _UNSCALING]
    unscaling += _helper_stmts(model, body, *_UNSCALING)
    found = []
    for site in body.sites:
        if not is_torch_clip(model, site):
            continue
        before = [
            sb
            for sb in scaled
            if sb.site.stmt.order < site.stmt.order and same_path(sb.site.stmt, site.stmt)
        ]
        bare = [
            sb for sb in before if not _unscaled_between(body, sb.site.stmt, site.stmt, unscaling)
        ]
        if bare:
            found.append(ScaledClip(site, body, bare[-1]))
    return found


def _unscaled_between(body: Body, backward: Stmt, clip: Stmt, unscaling: list[Stmt]) -> bool:
    """An unscaling statement between the two that runs whenever both do: `if amp: backward;
    unscale_` and `if clip: unscale_; clip(...)` both count, `if log: unscale_` does not."""
    allowed = body.conditions(backward) | body.conditions(clip)
    for stmt in unscaling:
        if backward.order < stmt.order < clip.order:
            if same_path(stmt, backward) and same_path(stmt, clip):
                if body.conditions(stmt) <= allowed:
                    return True
    return False


def unscale_target(model: Model, clip: ScaledClip) -> str | None:
    """The optimizer to unscale before a clip: the one of the next `scaler.step(...)` of the same
    scaler on the clip's path."""
    for site in clip.body.sites:
        if site.kind != "scaler_step" or site.receiver != clip.scaled.scaler:
            continue
        if site.stmt.order > clip.site.stmt.order and same_path(site.stmt, clip.site.stmt):
            args = positional(site.call) if site.call is not None else []
            return code(args[0]) if args else None
    return None


# ACL104 under an engine -------------------------------------------------------------------------
@dataclass(eq=False)
class EngineClip:
    """A torch clip after an Accelerate / guard engine backward whose precision may be fp16, or
    in a file that configures FSDP."""

    site: Site
    engine: str  # the engine expression the backward uses
    precision: str | None  # "fp16", or None when not statically known
    fsdp: bool
    # Only the first flagged clip of a path gets a fix: once it unscales, the later ones are
    # judged again (a second unscale before `update()` would raise).
    first: bool = True


def engine_clips(model: Model, body: Body) -> list[EngineClip]:
    if body.loop is None:
        return []
    fsdp = fsdp_configured(model)
    backwards = []
    for site in body.sites:
        if site.kind != "engine_backward":
            continue
        engine = model.engine_for(site.receiver, site.stmt.scope)
        if engine is not None and engine.kind in ("accelerate", "guard"):
            backwards.append((site, engine))
    # `accelerator.clip_grad_norm_` unscales too: a torch clip after it sees true gradients.
    unscaling = [s.stmt for s in body.sites if s.kind == "unscale" or _engine_clip(model, s)]
    unscaling += _helper_stmts(model, body, "unscale")
    found: list[EngineClip] = []
    for site in body.sites:
        if not is_torch_clip(model, site):
            continue
        for backward, engine in reversed(backwards):
            if backward.stmt.order > site.stmt.order or not same_path(backward.stmt, site.stmt):
                continue
            if _unscaled_between(body, backward.stmt, site.stmt, unscaling):
                break
            precision = engine_precision(engine)
            if precision in ("fp16", None) or fsdp:
                first = not any(same_path(f.site.stmt, site.stmt) for f in found)
                name = backward.receiver or engine.name
                found.append(EngineClip(site, name, precision, fsdp, first))
            break
    return found


def _engine_clip(model: Model, site: Site) -> bool:
    return site.kind == "clip" and site.call is not None and not is_torch_clip(model, site)


def engine_precision(engine) -> str | None:
    """The engine's mixed precision when statically known: its literal argument, or the guard
    engine's default `"no"` when it is given none."""
    if engine.mixed_precision is not None:
        return engine.mixed_precision
    call = engine.node
    if engine.kind == "guard" and isinstance(call, cst.Call):
        given = any(
            a.star or (a.keyword and a.keyword.value == "mixed_precision") for a in call.args
        )
        if not given and not positional(call):
            return "no"
    return None


def fsdp_configured(model: Model) -> bool:
    """An FSDP plugin in the file: `FullyShardedDataParallelPlugin(...)` or `fsdp_plugin=`."""
    return model.memo("scaler_protocol.fsdp", _find_fsdp)


def _find_fsdp(model: Model) -> bool:
    for call in model.calls:
        if last_part(model.imports.qualify(call.call.func)) == "FullyShardedDataParallelPlugin":
            return True
        if any(a.keyword is not None and a.keyword.value == "fsdp_plugin" for a in call.call.args):
            return True
    return False
