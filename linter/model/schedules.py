"""Schedulers and the lengths they are built with: what a schedule's length counts (ACL310).

A length expression is followed back through the names it reads (the binding visible where the
scheduler is built, so the HF examples' recomputation of `num_update_steps_per_epoch` after
`prepare` does not count) down to the `len(loader)` calls it grows from. Each of them carries:

- whether the loader had gone through `prepare(...)` before the `len` was read: then it counts
  per-process batches, W times fewer than the global batches Accelerate expects;
- the net power of K and of the world size applied on the way (`ceil(len(dl) / K) * epochs` is
  K^-1; `max_train_steps * K` after that is K^0 again, a length in micro-batches).

Lengths from configuration (`args.max_train_steps` given by the user) have no `len` and are never
judged: the catalogue leaves explicit step counts alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    code,
    dotted,
    is_false,
    keyword,
    last_part,
    method_call,
    positional,
    strip_parens,
)
from linter.model.depths import SCHEDULE_DEPTH
from linter.model.functions import Scope, Stmt
from linter.model.kinds import GateKind, SiteKind
from linter.model.setup import is_prepare

if TYPE_CHECKING:
    from linter.model import Model, Site, TrainingLoop

_K_NAME = re.compile(r"grad(ient)?_?acc|accum", re.I)  # the catalogue's accumulation value
_WORLD = re.compile(r"num_processes|world_size|WORLD_SIZE|n_gpus?\b|num_gpus|nprocs|num_replicas")
_LOADER = re.compile(r"loader|(^|_)dl(_|$)|batches", re.I)
_PASS_FUNCTIONS = {"ceil", "floor", "int", "round", "max", "min", "float", "abs"}
# (parameter, its position) of the lengths a constructor takes; None: keyword only.
_LENGTH_PARAMETERS = {
    "get_scheduler": (("num_training_steps", None),),
    "OneCycleLR": (("total_steps", 2), ("steps_per_epoch", 4)),
    "CosineAnnealingLR": (("T_max", 1),),
    "LinearLR": (("total_iters", None),),
    "PolynomialLR": (("total_iters", 1),),
}
_WARMUP_FACTORY = re.compile(r"^get_\w+_schedule_with_warmup$")


@dataclass(frozen=True)
class LoaderLength:
    """One `len(loader)` a schedule length grows from."""

    call: cst.Call
    loader: str
    per_process: bool  # the loader came from `prepare(...)` before the `len` was read
    k_power: int  # net power of K on the way to the length (-1: optimizer steps)
    w_power: int  # net power of the world size (+1: a per-process count made global)
    stmt: Stmt  # where the `len` is read


@dataclass(eq=False)
class Schedule:
    name: str
    call: cst.Call
    stmt: Stmt
    length: cst.BaseExpression
    parameter: str
    loader_lengths: list[LoaderLength] = field(default_factory=list)
    prepare: cst.Call | None = None  # the later `prepare(...)` that takes the scheduler
    steps: list[tuple[TrainingLoop, Site]] = field(default_factory=list)
    # net powers of K on the way to the length's other leaves (`args.max_steps * K`: 1)
    count_k_powers: list[int] = field(default_factory=list)
    warmup_k_powers: list[int] = field(default_factory=list)

    def unit(self) -> str | None:
        """What the length counts: "micro" (micro-batches: `len(dl) * epochs`, `max_steps * K`),
        "update" (optimizer steps: `ceil(len(dl) / K) * epochs`, `max_steps // K`), or None
        (a bare count such as `args.max_steps`, or mixed evidence). A warm-up multiplied by K
        (`args.warmup * K`) beside a bare count marks micro-batches too."""
        units = {"micro" if f.k_power >= 0 else "update" for f in self.loader_lengths}
        units |= {_count_unit(p) for p in self.count_k_powers} - {None}
        if not units:
            units = {_count_unit(p) for p in self.warmup_k_powers} - {None}
        return units.pop() if len(units) == 1 else None


def _count_unit(k_power: int) -> str | None:
    """A count that is not a loader's length is in micro-batches when multiplied by K, in
    optimizer steps when divided by it, and unknown otherwise."""
    return "micro" if k_power > 0 else "update" if k_power < 0 else None


def schedules(model: Model) -> list[Schedule]:
    """Every scheduler built with a length argument, with what that length counts."""
    return model.memo("schedules", _build)


def _build(model: Model) -> list[Schedule]:
    built = {id(call) for call in model.setup.schedulers.values()}
    found = []
    for scope in model.scopes:
        for name, defs in scope.defs.items():
            for d in defs:
                if d.op != "=" or d.tuple_index is not None or not isinstance(d.value, cst.Call):
                    continue
                # the setup keeps one scheduler per name; each function may build its own
                if id(d.value) in built or _is_constructor(model, d.value):
                    found.extend(_schedule(model, name, d.value, d.stmt, d.stmt))
                    continue
                for call, where in _factory_returns(model, d.value, scope):
                    found.extend(_schedule(model, name, call, where, d.stmt))
    found.sort(key=lambda s: s.stmt.order)
    return found


def _factory_returns(model: Model, call: cst.Call, scope: Scope):
    """(scheduler construction, its return statement) of a module function that builds and
    returns the scheduler (`sched = make_scheduler(opt, loader, args)`); its parameters are
    resolved from this call by the model."""
    callee = model.local_function(call.func, scope)
    for value, stmt in callee.returns if callee is not None else ():
        value = strip_parens(value)
        if isinstance(value, cst.Call) and _length_argument(model, value) is not None:
            yield value, stmt


def _schedule(model: Model, name: str, call: cst.Call, where: Stmt, bound: Stmt) -> list:
    """The schedule built by `call` (at `where`) and bound to `name` (at `bound`)."""
    found = _length_argument(model, call)
    if found is None:
        return []
    parameter, length = found
    schedule = Schedule(name, call, bound, length, parameter)
    lengths = _Lengths(model)
    schedule.loader_lengths = lengths.of(length, where.scope, where.order, where)
    schedule.count_k_powers = lengths.count_powers
    warmup = _warmup_argument(model, call)
    if warmup is not None:
        warmups = _Lengths(model)
        warmups.of(warmup, where.scope, where.order, where)
        schedule.warmup_k_powers = warmups.count_powers
    schedule.prepare = _later_prepare(model, name, bound)
    names = {name} | {p.name for p in model.setup.prepared.values() if p.original == name}
    schedule.steps = [
        (loop, site)
        for loop in model.loops
        for site in loop.of_kind(SiteKind.SCHED_STEP)
        if site.receiver in names
    ]
    return [schedule]


def _is_constructor(model: Model, call: cst.Call) -> bool:
    constructor = last_part(model.imports.qualify(call.func) or dotted(call.func))
    return constructor in _LENGTH_PARAMETERS or bool(_WARMUP_FACTORY.match(constructor))


def _warmup_argument(model: Model, call: cst.Call) -> cst.BaseExpression | None:
    """`num_warmup_steps=` of `get_scheduler` and the `get_*_schedule_with_warmup` factories."""
    constructor = last_part(model.imports.qualify(call.func) or dotted(call.func))
    if constructor != "get_scheduler" and not _WARMUP_FACTORY.match(constructor):
        return None
    args = positional(call)
    position = 2 if constructor == "get_scheduler" else 1
    return keyword(call, "num_warmup_steps") or (args[position] if position < len(args) else None)


def _length_argument(model: Model, call: cst.Call) -> tuple[str, cst.BaseExpression] | None:
    constructor = last_part(model.imports.qualify(call.func) or dotted(call.func))
    parameters = _LENGTH_PARAMETERS.get(constructor)
    if parameters is None and _WARMUP_FACTORY.match(constructor):
        parameters = (("num_training_steps", 2),)
    args = positional(call)
    for parameter, position in parameters or ():
        value = keyword(call, parameter)
        if value is None and position is not None and position < len(args):
            value = args[position]
        if value is not None:
            return parameter, value
    return None


def _later_prepare(model: Model, name: str, built: Stmt) -> cst.Call | None:
    """The `accelerator.prepare(..., sched)` after the construction that wraps the scheduler."""
    for call in model.calls:
        if not is_prepare(call.method, "scheduler") or call.stmt.order <= built.order:
            continue
        if model.engine_for(call.receiver, call.stmt.scope) is None:
            continue
        if any(dotted(arg) == name for arg in positional(call.call)):
            return call.call
    return None


class _Lengths:
    """Follows a length expression back to the `len(loader)` calls it is made of."""

    def __init__(self, model: Model) -> None:
        self.model = model
        ks = _known_ks(model)
        self.known_k = {_short(e) for e in ks if not isinstance(e, cst.Integer)}
        self.literal_k = {code(e) for e in ks if isinstance(e, cst.Integer) and code(e) != "1"}
        # the power of K on the way to each leaf that is not a loader's length: a parameter,
        # a configuration value (`args.max_steps`, `cfg["max_steps"]`), a literal
        self.count_powers: list[int] = []

    def of(self, node, scope: Scope, order: int, stmt: Stmt, k=0, w=0, depth=0) -> list:
        if depth > SCHEDULE_DEPTH:
            return []
        node = strip_parens(node)
        if isinstance(node, (cst.Integer, cst.Subscript)):
            self.count_powers.append(k)
            return []
        if isinstance(node, (cst.Name, cst.Attribute)) and dotted(node) is not None:
            return self._name(dotted(node), scope, order, k, w, depth)
        if isinstance(node, cst.Call):
            return self._call(node, scope, order, stmt, k, w, depth)
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, (cst.Add, cst.Subtract)):
                sides = (node.left, node.right)
                return [x for s in sides for x in self.of(s, scope, order, stmt, k, w, depth)]
            if isinstance(node.operator, (cst.Multiply, cst.Divide, cst.FloorDivide)):
                return self._product(node, scope, order, stmt, k, w, depth)
        if isinstance(node, cst.IfExp):  # `max_steps if overrode else max_steps * W`
            arms = (node.body, node.orelse)
            return [x for a in arms for x in self.of(a, scope, order, stmt, k, w, depth)]
        return []

    def _product(self, node, scope, order, stmt, k, w, depth) -> list:
        """A product of factors: K and the world size change the powers; the other factors of
        the numerator carry lengths (`len(dl) * epochs`); a denominator's `len` is no length
        (`max_steps / len(dl)` counts epochs)."""
        factors = list(_factors(node, 1))
        for factor, power in factors:
            if self.is_k(factor):
                k += power
            elif is_world_size(factor):
                w += power
        found = []
        for factor, power in factors:
            if power > 0 and not self.is_k(factor) and not is_world_size(factor):
                found.extend(self.of(factor, scope, order, stmt, k, w, depth + 1))
        return found

    def _call(self, node: cst.Call, scope, order, stmt, k, w, depth) -> list:
        args = positional(node)
        name = dotted(node.func) or ""
        if name == "len" and args:
            loader = dotted(args[0])
            if loader is None or not self._loader_like(loader, scope, order):
                return []
            prepared = self._prepared_before(loader, scope, order)
            return [LoaderLength(node, loader, prepared, k, w, stmt)]
        if last_part(name) in _PASS_FUNCTIONS:
            return [x for a in args for x in self.of(a, scope, order, stmt, k, w, depth + 1)]
        return []

    def _name(self, text: str, scope: Scope, order: int, k, w, depth) -> list:
        """The binding visible at `order` (in the function, else the enclosing ones)."""
        while scope is not None:
            visible = scope.defs.get(text, ()) if order is None else scope.defs_before(text, order)
            defs = [d for d in visible if d.tuple_index is None]
            if defs:
                d = defs[-1]
                if d.op != "=":
                    return []
                return self.of(d.value, d.stmt.scope, d.stmt.order, d.stmt, k, w, depth + 1)
            if text in scope.params:
                self.count_powers.append(k)
                return []
            scope, order = scope.parent, None
        self.count_powers.append(k)
        return []

    def _prepared_before(self, text: str, scope: Scope, order: int, depth: int = 0) -> bool:
        """Whether the loader was returned by `prepare` before this read: for a name this
        function binds, its last binding before the read (`dl = accelerator.prepare(dl)` after
        the scheduler leaves the unprepared loader here; the model's loop-minded lookup would
        count every binding); a parameter or an outer name is resolved by the model."""
        if scope.defs.get(text):
            before = scope.defs_before(text, order)
            return bool(before) and before[-1] in self.model.setup.prepared_defs
        if text in scope.params:  # what this module's callers pass (`make_scheduler(opt, dl)`)
            if depth >= SCHEDULE_DEPTH:
                return False
            return any(
                dotted(e) is not None
                and self._prepared_before(dotted(e), s.scope, s.order, depth + 1)
                for e, s in self.model.argument_sites(scope, text)
            )
        return self.model.is_prepared(text, scope, order)

    def _loader_like(self, text: str, scope: Scope, order: int) -> bool:
        """A data loader (named so, or returned by `prepare`), not a dataset counted in
        samples."""
        return bool(_LOADER.search(last_part(text))) or self._prepared_before(text, scope, order)

    def is_k(self, node: cst.BaseExpression) -> bool:
        """The accumulation value: named so, or spelled like the engine's or a step gate's K
        (a name, an attribute or a subscript such as `config["grad_accum"]`, never a call that
        merely reads K among its arguments)."""
        if isinstance(strip_parens(node), cst.Integer):  # `len(dl) // 4` beside `% 4`
            return code(strip_parens(node)) in self.literal_k
        if not _named_value(node):
            return False
        short = _short(node)
        return bool(_K_NAME.search(short)) or short in self.known_k


def is_world_size(node: cst.BaseExpression) -> bool:
    """The number of processes: `accelerator.num_processes`, `world_size`,
    `dist.get_world_size()`, `int(os.environ["WORLD_SIZE"])`."""
    node = strip_parens(node)
    if isinstance(node, cst.Call):
        name = last_part(dotted(node.func))
        if name == "get_world_size":
            return True
        return name in ("int", "float") and any(is_world_size(a) for a in positional(node))
    return _named_value(node) and bool(_WORLD.search(code(node)))


def _named_value(node: cst.BaseExpression) -> bool:
    return dotted(node) is not None or isinstance(strip_parens(node), cst.Subscript)


def _factors(node, power: int):
    """(factor, +1 or -1) of a chain of `*`, `/` and `//`."""
    node = strip_parens(node)
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Multiply):
            yield from _factors(node.left, power)
            yield from _factors(node.right, power)
            return
        if isinstance(node.operator, (cst.Divide, cst.FloorDivide)):
            yield from _factors(node.left, power)
            yield from _factors(node.right, -power)
            return
    yield node, power


def _short(node: cst.BaseExpression) -> str:
    text = dotted(node)
    return last_part(text) if text else code(strip_parens(node))


def _known_ks(model: Model) -> list[cst.BaseExpression]:
    ks = [e.accum for e in model.setup.engines.values() if e.accum is not None]
    ks += [loop.gate.k for loop in model.loops if loop.gate is not None and loop.gate.k is not None]
    return [k for k in ks if not isinstance(k, cst.Float)]


# engine options --------------------------------------------------------------------------


def splits_batches(model: Model) -> bool:
    """`split_batches=True` somewhere in the setup (on the Accelerator or a
    DataLoaderConfiguration): the prepared scheduler then steps once per optimizer step. A value
    the linter cannot read counts as True (no finding)."""
    return _option_set(model, "split_batches", lambda value: not is_false(value))


def steps_apart_from_optimizer(model: Model) -> bool:
    """`step_scheduler_with_optimizer=False`: the prepared scheduler steps on every call, as an
    unprepared one does."""
    return _option_set(model, "step_scheduler_with_optimizer", _not_true)


def _option_set(model: Model, name: str, accept) -> bool:
    for call in model.calls:
        value = keyword(call.call, name)
        if value is not None and accept(value):
            return True
    return False


def _not_true(value: cst.BaseExpression) -> bool:
    return not (isinstance(value, cst.Name) and value.value == "True")


def sized_for(model: Model, site: Site) -> list[Schedule]:
    """The schedules this `sched.step()` advances: those built in its function when there
    are any (steps are matched by name, and each of several functions may build its own
    `lr_scheduler`), else those built elsewhere (`self.lr_scheduler`, a module-level one)."""
    found = [s for s in schedules(model) if any(stepped is site for _, stepped in s.steps)]
    here = [s for s in found if s.stmt.scope is site.stmt.scope]
    return here or found


def steps_per_update(model: Model, schedule: Schedule, loop: TrainingLoop, site: Site) -> bool:
    """Whether this `sched.step()` advances the schedule once per optimizer step: it sits on the
    update step, or the scheduler went through `prepare` and is stepped in an `accumulate()`
    loop (the prepared scheduler skips the micro-steps that do not sync)."""
    if model.on_update_step(loop, site.stmt):
        return True
    prepared = schedule.prepare is not None and not steps_apart_from_optimizer(model)
    return (
        prepared
        and loop.gate is not None
        and loop.gate.kind in (GateKind.ACCUMULATE, GateKind.SYNC)
    )


def accumulation_value(model: Model, loop: TrainingLoop) -> cst.BaseExpression | None:
    """K of the loop that steps the scheduler (the step gate's, else the engine's), when it may
    be greater than 1."""
    k = loop.gate.k if loop.gate is not None and loop.gate.k is not None else model.engine_k()
    value = model.fixed_int(k)
    if k is None or (value is not None and value <= 1):
        return None
    return k


def prepare_engine(call: cst.Call | None) -> str | None:
    pair = method_call(call) if call is not None else None
    return dotted(pair[0]) if pair is not None else None


def describe(model: Model, loop: TrainingLoop) -> list[dict]:
    """`--show-loops`: the schedules this loop steps and what their lengths count."""
    return [
        {
            "scheduler": schedule.name,
            "line": model.line(schedule.call),
            "length": f"{schedule.parameter}={code(schedule.length)}",
            "prepared_at": model.line(schedule.prepare) if schedule.prepare else None,
            "counts": schedule.unit(),
            "from": [
                {
                    "len": code(found.call),
                    "per_process": found.per_process,
                    "power_of_k": found.k_power,
                    "power_of_processes": found.w_power,
                    "line": model.line(found.call),
                }
                for found in schedule.loader_lengths
            ],
        }
        for schedule in schedules(model)
        if any(stepping is loop for stepping, _ in schedule.steps)
    ]
