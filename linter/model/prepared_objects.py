"""Original and prepared names (ACL108): which optimizer and scheduler objects `prepare(...)`
handed back under a new name, and where the module still steps or zeroes the originals.

`p_opt = accelerator.prepare(opt)` (or one element of a tuple unpacking, `self.opt` included)
leaves two names: `opt`, the object the engine wraps, and `p_opt`, the wrapper that gates its
step on sync steps. Reading either is harmless (the wrapper shares `param_groups` and
`state_dict`), and so is anything done with `opt` before the prepare (a scheduler must be built
on it). What matters is a `.step()` / `.zero_grad()` that reaches the original after the
prepare: through the same name in the same function, in a function that reads it from an
enclosing scope, in another method of the class (`self.optimizer` vs `self.opt`), or through a
helper's parameter bound to the original at a call after the prepare.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from linter.model import accumulation, schedules, windows
from linter.model.cst_util import code, dotted, positional, strip_parens
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import CallSite, Def, Scope, Stmt
from linter.model.kinds import RegionKind, SiteKind
from linter.model.loops import Site
from linter.model.setup import PREPARE_ONE, Prepared, is_prepare

_METHODS = ("step", "zero_grad")


@dataclass(eq=False)
class Rebinding:
    """A prepare that returned `prepared.name` for `prepared.original` (different names)."""

    prepared: Prepared
    stmt: Stmt  # the assignment holding the prepare call
    role: str  # "optimizer" | "scheduler"


@dataclass(eq=False)
class OriginalUse:
    """`.step()` / `.zero_grad()` calls in one function that reach the original object of one
    rebinding: directly (`calls` on the original name) or through a helper's parameter bound to
    it at `arguments` (expression passed, calling statement)."""

    rebinding: Rebinding
    scope: Scope
    calls: list[CallSite]
    arguments: list[tuple[object, Stmt]] = field(default_factory=list)
    fixable: bool = False  # the prepared name is in scope wherever the fix writes it

    @property
    def through_parameter(self) -> bool:
        return bool(self.arguments)


def rebindings(model) -> list[Rebinding]:
    """Every prepare of an optimizer or scheduler whose result got a new name."""
    return model.memo("prepared_objects.rebindings", _rebindings)


def _rebindings(model) -> list[Rebinding]:
    found = []
    for d in sorted(model.setup.prepared_defs, key=lambda d: (d.stmt.order, d.tuple_index or 0)):
        prepared = _record(model, d)
        if prepared is None or prepared.name == prepared.original or dotted_name(prepared) is None:
            continue
        role = _role(model, prepared)
        if role is not None:
            found.append(Rebinding(prepared, d.stmt, role))
    return found


def dotted_name(prepared: Prepared) -> str | None:
    """The original as a plain or `self.` name (a constructor call passed inline has none)."""
    text = prepared.original
    return text if text.replace(".", "").replace("_", "").isalnum() else None


def _record(model, d: Def) -> Prepared | None:
    """The setup's record for this assignment; one rebuilt alike when a later prepare of the
    same target name replaced it in the setup's table."""
    known = model.setup.prepared.get(d.target)
    if known is not None and known.node is d.value:
        return known
    args = positional(d.value)
    index = d.tuple_index if d.tuple_index is not None else 0
    if index >= len(args):
        return None
    engine = dotted(d.value.func.value) or ""
    return Prepared(d.target, code(args[index]), engine, d.value, d.stmt.scope)


def _role(model, prepared: Prepared) -> str | None:
    names = (prepared.original, prepared.name)
    if any(n in model.setup.schedulers or model.is_scheduler(n) for n in names):
        return "scheduler"
    if any(n in model.setup.optimizers or model.is_optimizer(n) for n in names):
        return "optimizer"
    return None


# --- uses of the originals ------------------------------------------------------------------


def original_uses(model) -> list[OriginalUse]:
    """The step / zero_grad calls on originals after their prepare, one group per function."""
    return model.memo("prepared_objects.original_uses", _original_uses)


def _original_uses(model) -> list[OriginalUse]:
    groups: dict[tuple[int, int, str], OriginalUse] = {}
    for rebinding in rebindings(model):
        for call in model.calls:
            if call.method not in _METHODS or call.receiver is None:
                continue
            if call.method == "zero_grad" and rebinding.role != "optimizer":
                continue
            scope, order = call.stmt.scope, call.stmt.order
            original = rebinding.prepared.original
            if call.receiver == original and holds_original(
                model, rebinding, original, scope, order
            ):
                key = (id(rebinding), id(scope), "")
                group = groups.setdefault(key, OriginalUse(rebinding, scope, []))
                group.calls.append(call)
                continue
            arguments = _original_arguments(model, rebinding, call)
            if arguments:
                key = (id(rebinding), id(scope), call.receiver)
                group = groups.setdefault(key, OriginalUse(rebinding, scope, [], arguments))
                group.calls.append(call)
    for group in groups.values():
        group.fixable = _fixable(model, group)
    return sorted(groups.values(), key=lambda g: g.calls[0].stmt.order)


def _original_arguments(model, rebinding: Rebinding, call: CallSite) -> list[tuple[object, Stmt]]:
    """For `optimizer.step()` on a helper's parameter: the call sites that pass the original
    after the prepare (empty when the parameter is reassigned before the call)."""
    scope, name = call.stmt.scope, call.receiver
    if name not in scope.params or scope.defs_before(name, call.stmt.order):
        return []
    original = rebinding.prepared.original
    return [
        (expr, stmt)
        for expr, stmt in model.argument_sites(scope, name)
        if dotted(expr) == original
        and holds_original(model, rebinding, original, stmt.scope, stmt.order)
    ]


def holds_original(model, rebinding: Rebinding, text: str, scope: Scope, order: int) -> bool:
    """Whether `text` at statement `order` of `scope` still names the object the prepare
    wrapped: the use comes after the prepare, and nothing rebinds the name in between."""
    home, at = rebinding.stmt.scope, rebinding.stmt.order
    if text.startswith("self."):
        if scope.class_name is None or scope.class_name != home.class_name:
            return False
        if scope is home:
            return order > at and not _assigned_between(home, text, at, order)
        return not _assigned_between(home, text, at, None) and not scope.defs_before(text, order)
    enclosing = _enclosing(scope, home, text)
    if enclosing is None:
        return False
    if scope is home:
        return order > at and not _assigned_between(home, text, at, order)
    return not _assigned_between(home, text, at, None)


def holds_prepared(model, rebinding: Rebinding, scope: Scope, order: int) -> bool:
    """Whether the prepared name can be written at statement `order` of `scope`."""
    name, home = rebinding.prepared.name, rebinding.stmt.scope
    if name == "_" or _assigned_between(home, name, rebinding.stmt.order, order):
        return False  # a discarded or rebound wrapper cannot be written in its place
    if name.startswith("self."):
        params = list(scope.params)
        same_class = scope.class_name is not None and scope.class_name == home.class_name
        return same_class and bool(params) and params[0] == "self"
    if _enclosing(scope, home, name) is None:
        return False
    return scope is not home or order > rebinding.stmt.order


def _enclosing(scope: Scope, home: Scope, name: str) -> Scope | None:
    """`home` when `name` read in `scope` resolves there (no function in between binds it)."""
    current = scope
    while current is not home:
        if name in current.params or name in current.defs:
            return None
        current = current.parent
        if current is None:
            return None
    return home


def _assigned_between(scope: Scope, text: str, start: int, end: int | None) -> bool:
    return any(
        start < d.stmt.order and (end is None or d.stmt.order < end)
        for d in scope.defs.get(text, ())
    )


def _fixable(model, group: OriginalUse) -> bool:
    if group.through_parameter:
        return all(
            holds_prepared(model, group.rebinding, s.scope, s.order) for _, s in group.arguments
        )
    return all(
        holds_prepared(model, group.rebinding, c.stmt.scope, c.stmt.order) for c in group.calls
    )


# --- schedulers that never went through prepare ---------------------------------------------


@dataclass(eq=False)
class UnpreparedStep:
    """`sched.step()` inside `accumulate()` (K > 1) of a scheduler no prepare call was given."""

    site: Site
    engine: str | None  # the engine whose accumulate() the step runs in


def unprepared_scheduler_steps(model) -> list[UnpreparedStep]:
    return model.memo("prepared_objects.unprepared_steps", _unprepared_steps)


def _unprepared_steps(model) -> list[UnpreparedStep]:
    passed = _passed_to_prepare(model)
    if not passed:
        return []  # no prepare in sight: the objects may be prepared by the caller's module
    found = []
    for loop in model.loops:
        for site in loop.of_kind(SiteKind.SCHED_STEP):
            if model.on_update_step(loop, site.stmt) or windows.is_plateau_step(model, site):
                continue  # stepped once per optimizer step, or by a metric
            engine = _accumulating_engine(model, site.stmt)
            if engine is False:
                continue
            if not _never_prepared(model, site.receiver, site.stmt.scope, passed, 0):
                continue
            if not _counts_micro_batches(model, site.receiver):
                found.append(UnpreparedStep(site, engine))
    return found


def _passed_to_prepare(model) -> set[str]:
    """The text of every argument of every prepare call of an engine in the module, the
    one-object forms included (`accelerator.prepare_scheduler(sched)`)."""
    texts = set()
    for call in model.calls:
        prepares = is_prepare(call.method, *PREPARE_ONE)
        if prepares and model.engine_for(call.receiver, call.stmt.scope):
            texts.update(code(arg.value) for arg in call.call.args)
    return texts


def _accumulating_engine(model, stmt: Stmt) -> str | None | bool:
    """The engine whose `accumulate()` holds the statement (here or in a caller), when it
    spans several micro-steps; False when there is none."""
    regions = model.regions_around(stmt, RegionKind.ACCUMULATE)
    if regions:
        receiver = regions[-1].receiver
        return receiver if windows.accumulates_more_than_once(model, receiver) else False
    if not accumulation.entered_accumulate(model, stmt):
        return False
    configured = [c for c in accumulation.configurations(model).values() if c.accumulates]
    return configured[0].engine if configured else False


def _never_prepared(model, text: str | None, scope: Scope, passed: set[str], depth: int) -> bool:
    """A scheduler built in this module that no prepare call received: by its own name, or as
    what every caller of a helper passes for the parameter."""
    if not text or text in passed or text in model.setup.prepared:
        return False
    if text in scope.params and not scope.defs.get(text):
        sites = model.argument_sites(scope, text)
        if not sites or depth > FOLLOW_DEPTH:
            return False
        return all(_never_prepared(model, dotted(e), s.scope, passed, depth + 1) for e, s in sites)
    return text in model.setup.schedulers


def _counts_micro_batches(model, name: str | None) -> bool:
    """A schedule built for one step per micro-batch (`num_training_steps=max_steps * K`, or
    `len(dl) * epochs` with no division by K) is stepped at the rate it was built for."""
    for schedule in schedules.schedules(model):
        if schedule.name != name:
            continue
        if any(length.k_power >= 0 for length in schedule.loader_lengths):
            return True
        factors = _factors(schedule.length, 1)
        return any(p > 0 and accumulation.is_k_name(accumulation.short_name(f)) for f, p in factors)
    return False


def _factors(node, power: int) -> list[tuple[cst.BaseExpression, int]]:
    """(factor, +1 or -1) of a chain of `*` and `/`."""
    node = strip_parens(node)
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Multiply):
            return _factors(node.left, power) + _factors(node.right, power)
        if isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            return _factors(node.left, power) + _factors(node.right, -power)
    return [(node, power)]


# --- --show-loops ---------------------------------------------------------------------------


def describe(model, loop) -> dict:
    """The original vs prepared names, and this loop's calls that still reach an original."""
    in_loop = {id(s.call) for s in loop.sites if s.call is not None}
    return {
        "renamed": [
            {
                "original": r.prepared.original,
                "prepared": r.prepared.name,
                "role": r.role,
                "line": model.line(r.stmt.node),
            }
            for r in rebindings(model)
        ],
        "original_used": [
            {"code": code(c.call), "line": model.line(c.call), "use": u.rebinding.prepared.name}
            for u in original_uses(model)
            for c in u.calls
            if id(c.call) in in_loop
        ],
        "never_prepared_schedulers": [
            {"code": code(s.site.call), "line": model.line(s.site.call)}
            for s in unprepared_scheduler_steps(model)
            if id(s.site.call) in in_loop
        ],
    }
