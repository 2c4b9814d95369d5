"""Accumulation facts: the value K a module configures, the expressions that spell it, where it is
read, how often a loop iteration enters `accumulate()`, and which loaders went through `prepare`.

K is configured on an engine (`Accelerator(gradient_accumulation_steps=...)`, a
`GradientAccumulationPlugin`, the guard `Engine`, a DeepSpeed config dict) or handed to a trainer
(`TrainingArguments(gradient_accumulation_steps=...)`). An expression spells K when it is that
configured value, an engine's own `gradient_accumulation_steps`, a name of the accumulation
pattern (`args.grad_accum`, `self.accum`, `cfg["grad_accum"]`), or a name bound to one of those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from linter.model.cst_util import (
    code,
    dotted,
    has_star_kwargs,
    int_value,
    is_false,
    keyword,
    last_part,
    positional,
    string_value,
    strip_parens,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import CallSite, Frame, Scope, Stmt
from linter.model.kinds import EngineKind, FrameKind, GateKind, RegionKind
from linter.model.loops import Region
from linter.model.setup import is_prepare

# The Conventions' accumulation names, on the last part of an expression (`args.grad_accum`,
# `cfg["accum_iter"]`). A loss accumulator (`loss_accum`) or a micro-step counter is not K.
_K_NAME = re.compile(
    r"^(\w+_)?(grad(ient)?_?acc(um(ulat(e|ion))?)?|accum(ulat(e|ion))?)"
    r"(_?(steps|iters?|iterations|freq|every|batches|grads?))?$"
    r"|^accumulate_grad_batches$",
    re.I,
)
_NOT_K = re.compile(r"loss|count|counter|idx|index", re.I)
_ENGINE_ATTR = "gradient_accumulation_steps"
_ACCUMULATE_CALL = re.compile(r"\.accumulate\(")
# Calls that keep the value of their argument (`int(args.accum)`).
PASS_CALLS = {"int", "float", "max", "min", "round", "math.ceil", "math.floor", "ceil", "floor"}
_LOADER_WRAPPERS = {"enumerate", "iter", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "zip"}


# --- what the module configures -----------------------------------------------------------
@dataclass(eq=False)
class Configured:
    """K as an engine sees it: `value` is None when the engine gets no K in code."""

    engine: str
    kind: EngineKind  # accelerate, guard or deepspeed
    value: cst.BaseExpression | None
    known: bool  # False when the configuration is out of sight (`**kwargs`, a JSON file)
    number: int | None = None  # the value's integer, when a literal gives it

    @property
    def accumulates(self) -> bool | None:
        """True for K > 1 (or a K of unknown value), False for none or a literal 1."""
        if not self.known:
            return None
        if self.value is None:
            return False
        return self.number is None or self.number > 1


def configurations(model) -> dict[str, Configured]:
    return model.memo("accumulation.configured", _configurations)


def _configurations(model) -> dict[str, Configured]:
    found = {}
    for name, engine in model.setup.engines.items():
        if engine.kind in (EngineKind.ACCELERATE, EngineKind.GUARD):
            value = engine.accum
            if value is None and isinstance(engine.node, cst.Call):
                value = _positional_plugin_steps(model, engine.node)
            hidden = has_star_kwargs(engine.node) or _opaque_plugin(model, engine.node)
            known = value is not None or not hidden
            found[name] = Configured(name, engine.kind, value, known, model.fixed_int(value))
        elif engine.kind == EngineKind.DEEPSPEED:
            value = _deepspeed_k(model)
            found[name] = Configured(
                name, EngineKind.DEEPSPEED, value, value is not None, model.fixed_int(value)
            )
    return found


def _positional_plugin_steps(model, call: cst.Call) -> cst.BaseExpression | None:
    """`GradientAccumulationPlugin(4)` (num_steps is its first field)."""
    plugin = keyword(call, "gradient_accumulation_plugin")
    if plugin is not None and not isinstance(plugin, cst.Call):
        defs = model.module_defs(dotted(plugin) or "")
        plugin = defs[-1].value if defs else None
    if isinstance(plugin, cst.Call) and positional(plugin):
        return positional(plugin)[0]
    return None


def _opaque_plugin(model, call) -> bool:
    """`gradient_accumulation_plugin=plugin` whose `num_steps` cannot be read here."""
    if not isinstance(call, cst.Call):
        return False
    return keyword(call, "gradient_accumulation_plugin") is not None


def _deepspeed_k(model) -> cst.BaseExpression | None:
    """`"gradient_accumulation_steps": K` in a config dict of the module."""
    for d in _dict_defs(model):
        for element in d.value.elements:
            if isinstance(element, cst.DictElement):
                if string_value(element.key) == _ENGINE_ATTR:
                    return element.value
    return None


def _dict_defs(model):
    return [
        d
        for scope in model.scopes
        for ds in scope.defs.values()
        for d in ds
        if isinstance(d.value, cst.Dict)
    ]


def configured_for(model, engine_text: str | None) -> Configured | None:
    """The configuration of the engine an expression holds (the module's only one when the
    expression is an engine recognised by its name alone)."""
    known = configurations(model)
    if engine_text in known:
        return known[engine_text]
    engines = [c for c in known.values() if c.kind in (EngineKind.ACCELERATE, EngineKind.GUARD)]
    if engine_text and "." in engine_text:
        same = [c for c in engines if last_part(c.engine) == last_part(engine_text)]
        engines = same or engines
    return engines[0] if len(engines) == 1 else None


def opts_out_of_loader_sync(model) -> bool:
    """`GradientAccumulationPlugin(..., sync_with_dataloader=False)`: the code manages its own
    windows, so the loader it accumulates over is its own business."""
    return model.memo("accumulation.no_loader_sync", _opts_out)


def _opts_out(model) -> bool:
    for call in model.calls:
        if last_part(model.imports.qualify(call.call.func)) == "GradientAccumulationPlugin":
            if is_false(keyword(call.call, "sync_with_dataloader")):
                return True
    return False


# --- expressions that spell K -------------------------------------------------------------
def short_name(node: cst.CSTNode) -> str | None:
    """`grad_accum` for `args.grad_accum`, `cfg["grad_accum"]`, `cfg.get("grad_accum", 1)`,
    `getattr(args, "grad_accum", 1)` and `engine.gradient_accumulation_steps()`."""
    node = strip_parens(node)
    text = dotted(node)
    if text is not None:
        return last_part(text)
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index):
            return string_value(index.value)
    if isinstance(node, cst.Call):
        args = positional(node)
        name = dotted(node.func) or ""
        if name == "getattr" and len(args) >= 2:
            return string_value(args[1])
        if last_part(name) == "get" and args:
            return string_value(args[0])
        if not node.args and name:
            return last_part(name)
    return None


def is_k_name(name: str | None) -> bool:
    return bool(name) and bool(_K_NAME.match(name)) and not _NOT_K.search(name)


def spells_k(
    model, node: cst.CSTNode, scope: Scope | None = None, order: int | None = None
) -> bool:
    """Whether an expression is the accumulation value (see the module docstring)."""
    return _spells_k(model, strip_parens(node), scope, order, 0)


def _spells_k(model, node, scope, order, depth: int) -> bool:
    if depth > FOLLOW_DEPTH:
        return False
    if isinstance(node, cst.Call) and dotted(node.func) in PASS_CALLS and positional(node):
        return _spells_k(model, strip_parens(positional(node)[0]), scope, order, depth + 1)
    name = short_name(node)
    if is_k_name(name) and not _is_counter(model, node):
        return True
    if _equals_configured(model, node):
        return True
    text = dotted(node)
    if text is None or scope is None:
        return False
    defs = scope.defs_before(text, order) if order is not None else scope.defs.get(text, [])
    defs = defs or model.module_defs(text)
    if len(defs) != 1 or defs[0].op != "=" or defs[0].tuple_index is not None:
        return False
    d = defs[0]
    return _spells_k(model, strip_parens(d.value), d.stmt.scope, d.stmt.order, depth + 1)


def _is_counter(model, node) -> bool:
    """`accum_iter += 1`: a name that counts micro-steps is not K."""
    text = dotted(node)
    return text is not None and any(d.op == "+=" for d in model.module_defs(text))


def _equals_configured(model, node) -> bool:
    """The very expression an engine was given (`ACCUM`, `args.update_freq`, a literal 4)."""
    for configured in configurations(model).values():
        value = configured.value
        if value is None or not configured.accumulates:
            continue
        if int_value(value) is not None:
            if int_value(node) == int_value(value):
                return True
        elif code(node) == code(value) or (
            dotted(node) and dotted(value) and short_name(node) == short_name(value)
        ):
            return True
    return False


def engine_attribute(model, node: cst.CSTNode, scope: Scope | None = None) -> bool:
    """`accelerator.gradient_accumulation_steps` (or DeepSpeed's `engine.gradient_accumulation_
    steps()`): the engine's own K, whatever it was configured to; also a name whose last
    binding in the function is that (`args.gradient_accumulation_steps =
    model.gradient_accumulation_steps()` after `deepspeed.initialize`)."""
    node = strip_parens(node)
    if _the_engines_own(model, node, scope):
        return True
    text = dotted(node)
    defs = scope.defs.get(text, []) if text is not None and scope is not None else []
    last = defs[-1] if defs else None
    return (
        last is not None
        and last.op == "="
        and last.value is not None
        and _the_engines_own(model, strip_parens(last.value), scope)
    )


def _the_engines_own(model, node: cst.CSTNode, scope: Scope | None) -> bool:
    if isinstance(node, cst.Call) and not node.args:
        node = node.func
    if not isinstance(node, cst.Attribute) or node.attr.value != _ENGINE_ATTR:
        return False
    return model.engine_for(dotted(node.value), scope) is not None


def divides_like_engine(
    model, engine_text: str | None, divisor: cst.CSTNode, scope: Scope | None = None
) -> bool:
    """Whether dividing by `divisor` repeats the division the engine's backward does: its own
    `gradient_accumulation_steps` always; otherwise only while the engine accumulates, by an
    expression that spells K (with no K configured, a manual division is the only one)."""
    if engine_attribute(model, divisor, scope):
        return True
    configured = configured_for(model, engine_text)
    if configured is None or not configured.accumulates:
        return False
    return spells_k(model, divisor, scope)


# --- accumulate() entries, backward calls per entry, loaders -------------------------------
def accumulate_regions(model) -> list[Region]:
    return [r for r in model.regions if r.kind == RegionKind.ACCUMULATE]


def innermost_loop(frames: tuple[Frame, ...]) -> cst.CSTNode | None:
    loops = [f.node for f in frames if f.kind == FrameKind.LOOP]
    return loops[-1] if loops else None


def frames_before(frames: tuple[Frame, ...], node: cst.CSTNode) -> tuple[Frame, ...]:
    for i, frame in enumerate(frames):
        if frame.node is node:
            return frames[:i]
    return frames


def exclusive(a: tuple[Frame, ...], b: tuple[Frame, ...]) -> bool:
    """Whether no iteration runs both: an `if` (or an early exit) puts them on opposite sides."""
    sides = {id(f.node): f.holds for f in a if f.kind in (FrameKind.IF, FrameKind.EXIT)}
    return any(
        sides.get(id(f.node), f.holds) != f.holds
        for f in b
        if f.kind in (FrameKind.IF, FrameKind.EXIT)
    )


def entered_accumulate(model, stmt: Stmt, depth: int = 0) -> bool:
    """Whether `stmt` runs inside an `accumulate()` block, in its own function or in a caller
    that calls its function from inside one."""
    if model.regions_around(stmt, RegionKind.ACCUMULATE) or _in_indirect_accumulate(stmt):
        return True
    if depth >= FOLLOW_DEPTH or not isinstance(stmt.scope.node, cst.FunctionDef):
        return False
    calls = model.graph.callers(stmt.scope)
    return any(entered_accumulate(model, c.stmt, depth + 1) for c in calls)


def _in_indirect_accumulate(stmt: Stmt) -> bool:
    """`with ctx:` where `ctx = accelerator.accumulate(model)`, or `with accelerator.accumulate(
    model) if accumulating else nullcontext():`: an entry the region finder does not name."""
    for frame in stmt.frames:
        if frame.kind != FrameKind.WITH:
            continue
        for item in frame.node.items:
            value = item.item
            text = dotted(value)
            if text is not None:
                defs = stmt.scope.defs_before(text, stmt.order)
                value = defs[-1].value if defs and defs[-1].op == "=" else None
            if value is not None and _ACCUMULATE_CALL.search(code(value)):
                return True
    return False


_MANUAL_GATES = (GateKind.MODULO, GateKind.COUNTER, GateKind.MICRO_LOOP)


def windows_counted(model, loop, site) -> bool:
    """Whether the backward at `site` runs in counted windows: inside an `accumulate()` block
    (here or in a caller), in a loop that calls a training-step helper entering one, or under a
    manual gate on the optimizer step. Without them an engine configured for K steps the
    optimizer on every batch (ACL306)."""
    if entered_accumulate(model, site.stmt):
        return True
    gate = model.gate_for(loop, site.stmt)
    if gate is not None and gate.kind in _MANUAL_GATES:
        return True
    for call in loop.scope.calls:
        if any(f.node is loop.node for f in call.stmt.frames) or loop.node is loop.scope.node:
            callee = model.local_function(call.call.func, call.stmt.scope)
            if callee is not None and enters_accumulate(model, callee):
                return True
    return False


def enters_accumulate(model, scope: Scope) -> bool:
    """Whether a function enters `accumulate()` itself (a training-step helper)."""
    return any(region_scope(model, r) is scope for r in accumulate_regions(model))


def region_scope(model, region: Region) -> Scope | None:
    """The function (or module) whose body holds the `with` block."""
    return model.memo("accumulation.with_scopes", _with_scopes).get(id(region.with_node))


def _with_scopes(model) -> dict[int, Scope]:
    return {id(w): scope for scope in model.scopes for w, _ in scope.withs}


def loader_state(model, expr: cst.BaseExpression, scope: Scope, order: int, depth: int = 0) -> str:
    """ "prepared", "unprepared" (visibly a `DataLoader(...)` that never went through
    `prepare`), "range" (not a loader: `range`, `itertools.count`) or "unknown"."""
    expr = strip_parens(expr)
    if depth > FOLLOW_DEPTH:
        return "unknown"
    if isinstance(expr, cst.Call):
        return _call_loader_state(model, expr, scope, order, depth)
    text = dotted(expr)
    if text is None:
        return "unknown"
    defs = scope.defs_before(text, order) if "." not in text else []
    defs = defs or scope.defs.get(text, []) or model.module_defs(text)
    if any(d in model.setup.prepared_defs for d in defs):
        return "prepared"
    if not defs:
        if text in scope.params:
            sites = model.argument_sites(scope, text)
            states = {loader_state(model, e, s.scope, s.order, depth + 1) for e, s in sites}
            return _combine(states)
        if scope.parent is not None and "." not in text:
            return loader_state(model, expr, scope.parent, 10**9, depth + 1)
        return "unknown"
    states = set()
    for d in defs:
        if d.op != "=" or d.tuple_index is not None:
            states.add("unknown")
        else:
            states.add(loader_state(model, d.value, d.stmt.scope, d.stmt.order, depth + 1))
    return _combine(states)


def _combine(states: set[str]) -> str:
    if "prepared" in states:
        return "prepared"
    if states and states <= {"unprepared"}:
        return "unprepared"
    if states and states <= {"range"}:
        return "range"
    return "unknown"


def _call_loader_state(model, call: cst.Call, scope: Scope, order: int, depth: int) -> str:
    qual = model.imports.qualify(call.func) or ""
    name = last_part(qual)
    args = positional(call)
    if is_prepare(name, "data_loader"):
        return "prepared"
    if name == "skip_first_batches" and args:
        return loader_state(model, args[0], scope, order, depth + 1)
    if qual in _LOADER_WRAPPERS or name == "tqdm":
        return _combine({loader_state(model, a, scope, order, depth + 1) for a in args[:1]})
    if name in ("range", "count"):
        return "range"
    if name == "DataLoader":
        return "unprepared"
    return "unknown"


def next_calls(model, loop: cst.CSTNode, scope: Scope) -> list[CallSite]:
    """`next(it)` calls that draw batches in an iteration of `loop` (its own body, not an inner
    loop); `next(model.parameters())` reads a parameter, not a batch."""
    return [
        c
        for c in scope.calls
        if c.func == "next" and innermost_loop(c.stmt.frames) is loop and _draws_batches(c.call)
    ]


def _draws_batches(call: cst.Call) -> bool:
    args = positional(call)
    if not args:
        return False
    source = strip_parens(args[0])
    if isinstance(source, cst.Call) and dotted(source.func) == "iter" and positional(source):
        source = strip_parens(positional(source)[0])
    if isinstance(source, cst.Call):
        return False  # `next(model.parameters())`, `next(iter(model.buffers()))`
    return dotted(source) is not None


# --- what --show-loops prints -------------------------------------------------------------
def describe_loop(model, loop) -> dict:
    """The accumulation facts the ACL302/306/309/311/313 checks use, for one training loop
    (`describe` adds ACL313's `k_reads`: that module builds on this one)."""
    entries = [r for r in accumulate_regions(model) if innermost_loop(r.frames) is loop.node]
    state = "unknown"
    if isinstance(loop.node, cst.For):
        order = min((s.stmt.order for s in loop.sites), default=0)
        state = loader_state(model, loop.node.iter, loop.scope, order)
    return {
        "configured": [
            {
                "engine": c.engine,
                "k": code(c.value) if c.value is not None else None,
                "accumulates": {True: "yes", False: "no", None: "not statically known"}[
                    c.accumulates
                ],
            }
            for c in configurations(model).values()
        ],
        "accumulate_entries": [{"code": code(r.call), "line": model.line(r.call)} for r in entries],
        "backwards_in_an_entry": sum(entered_accumulate(model, s.stmt) for s in loop.backwards),
        "loader": state,
    }
