"""ACL103's questions, and the `update()` the fixes of ACL102 and ACL103 insert: which scaler steps
no update follows in every iteration that steps, and where the one update of an iteration goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import dotted, last_part, positional, walk
from linter.model.functions import Stmt
from linter.model.kinds import FrameKind, ScalerRole, SiteKind
from linter.model.loops import Site, same_path
from linter.model.scaler_protocol import Body, bypassing_steps, helper_stmts

if TYPE_CHECKING:
    from linter.model import Model


def stepping_stmts(model: Model, body: Body, scaler: str) -> list[Stmt]:
    """The statements that step through `scaler`: its `scaler.step(...)` calls and the direct
    `opt.step()` calls that ACL102 turns into `scaler.step(opt)`."""
    stmts = [s.stmt for s in body.sites if s.kind == SiteKind.SCALER_STEP and s.receiver == scaler]
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
    own = [s.stmt for s in body.sites if s.kind == SiteKind.SCALER_UPDATE and s.receiver == scaler]
    return own + helper_stmts(model, body, SiteKind.SCALER_UPDATE)


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
    # An update of a scaler of that name in another function (a caller updating once per epoch)
    # would run again after the inserted one, which torch rejects: then there is no fix.
    updated_elsewhere: bool = False


def missing_updates(model: Model, body: Body) -> list[MissingUpdate]:
    groups: dict[int, MissingUpdate] = {}
    for site in body.sites:
        if site.kind != SiteKind.SCALER_STEP or not site.receiver or site.call is None:
            continue
        if model.scaler_role(site.receiver, site.stmt.scope) == ScalerRole.DISABLED:
            continue
        args = positional(site.call)
        if args and model.is_prepared(dotted(args[0]), site.stmt.scope, site.stmt.order):
            continue  # the engine's optimizer updates the scaler itself
        if covering_update(model, body, site.stmt, site.receiver) is not None:
            continue
        if _updated_after_the_last_optimizer(model, body, site):
            continue
        if not body.repeats and _updated_anywhere(model, site.receiver):
            continue  # a wrapper's caller may update through another method
        anchor = update_anchor(model, body, site.receiver, site.stmt)
        group = groups.get(id(anchor))
        if group is None:
            partial = _partial_updates(model, body, site.receiver, anchor)
            group = groups[id(anchor)] = MissingUpdate(body, site.receiver, [], anchor, partial)
            group.updated_elsewhere = updated_in_other_scopes(model, body, site.receiver)
        group.steps.append(site)
    return list(groups.values())


def _updated_after_the_last_optimizer(model: Model, body: Body, step: Site) -> bool:
    """One `update()` after several `scaler.step(opt_i)` calls, spread over calls: the function
    steps the optimizer it is handed and updates under a test of its own parameters, and a caller
    runs it once per optimizer, passing the loop's optimizer and index (coqui's Trainer:
    `for idx, optimizer in enumerate(self.optimizer): self.optimize(..., optimizer, ..., idx)`
    with `if optimizer_idx is None or optimizer_idx + 1 == num_optimizers: scaler.update()`).
    Read in the function that holds the step, also where a caller's loop sees its statements."""
    own = _as_written(model, step.stmt)
    args = positional(step.call)
    if own is None or not isinstance(own.scope.node, cst.FunctionDef) or not args:
        return False
    scope = own.scope
    if not isinstance(args[0], cst.Name) or args[0].value not in scope.params:
        return False
    handed = model.argument_sites(scope, args[0].value)
    for update in updates(model, body, step.receiver):
        update = _as_written(model, update)
        if update is None or update.scope is not scope or update.order < own.order:
            continue
        if not same_path(update, own):
            continue
        for param in _parameters_tested(update, own) - {args[0].value}:
            for passed, call in model.argument_sites(scope, param):
                if any(
                    call is other and _one_loop_binds(call, passed, optimizer)
                    for optimizer, other in handed
                ):
                    return True
    return False


def _as_written(model: Model, stmt: Stmt) -> Stmt | None:
    """The statement in the function that holds it (not as a caller's loop sees it)."""
    if getattr(stmt, "via", None) is None:
        return stmt
    for scope in model.scopes:
        for own in scope.stmts:
            if own.node is stmt.node and getattr(own, "via", None) is None:
                return own
    return None


def _parameters_tested(update: Stmt, step: Stmt) -> set[str]:
    """The parameters read by the tests `update` needs beyond those of `step`; empty when such
    a test reads anything else (a counter, an attribute of `self`)."""
    around = {id(f.node) for f in step.frames}
    extra = [
        f.test
        for f in update.frames
        if f.kind in (FrameKind.IF, FrameKind.EXIT)
        and id(f.node) not in around
        and f.test is not None
    ]
    names = {n.value for t in extra for n in walk(t) if isinstance(n, cst.Name)}
    names -= {"None", "True", "False"}
    params = set(update.scope.params) - {"self", "cls"}
    return names if extra and names and names <= params else set()


def _one_loop_binds(call: Stmt, *passed: cst.BaseExpression) -> bool:
    """Whether one `for` around the call binds a name of each expression (`idx, optimizer`)."""
    for loop in call.loops():
        if isinstance(loop, cst.For):
            bound = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
            if all(
                any(isinstance(n, cst.Name) and n.value in bound for n in walk(expr))
                for expr in passed
            ):
                return True
    return False


def _partial_updates(model: Model, body: Body, scaler: str, anchor: Stmt) -> list[Stmt]:
    """The updates an inserted per-step `update()` replaces: those of the body that run on some
    iterations only, and those after the loop (once per epoch). Left in place, each would run
    a second time with no step recorded since the first, which torch rejects."""
    found = []
    for site in model.sites[id(body.scope)]:
        if site.kind != SiteKind.SCALER_UPDATE or site.receiver != scaler:
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


def updated_in_other_scopes(model: Model, body: Body, scaler: str) -> bool:
    """A scaler of that name updated in another function (a caller, once per epoch)."""
    name = last_part(scaler)
    return any(
        s.kind == SiteKind.SCALER_UPDATE and last_part(s.receiver) == name
        for scope in model.scopes
        if scope is not body.scope
        for s in model.sites[id(scope)]
    )


def _updated_anywhere(model: Model, scaler: str) -> bool:
    return any(
        s.kind == SiteKind.SCALER_UPDATE and s.receiver == scaler
        for sites in model.sites.values()
        for s in sites
    )


def has_update(model: Model, body: Body, scaler: str) -> bool:
    return bool(updates(model, body, scaler))
