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
    children,
    code,
    dotted,
    has_star_kwargs,
    int_value,
    is_false,
    keyword,
    last_part,
    method_call,
    positional,
    string_value,
    strip_parens,
    walk,
)
from linter.model.functions import CallSite, Frame, Scope, Stmt
from linter.model.loops import BACKWARD_KINDS, Region

# The Conventions' accumulation names, on the last part of an expression (`args.grad_accum`,
# `cfg["accum_iter"]`). A loss accumulator (`loss_accum`) or a micro-step counter is not K.
_K_NAME = re.compile(
    r"^(\w+_)?(grad(ient)?_?acc(um(ulat(e|ion))?)?|accum(ulat(e|ion))?)"
    r"(_?(steps|iters?|iterations|freq|every|batches|grads?))?$"
    r"|^accumulate_grad_batches$",
    re.I,
)
_NOT_K = re.compile(r"loss|count|counter|idx|index", re.I)
# Keyword arguments and config keys that hand K to something that accumulates.
_K_KEYS = {"gradient_accumulation_steps", "num_steps", "accumulate_grad_batches", "update_freq"}
_ENGINE_ATTR = "gradient_accumulation_steps"
_LOG_CALLS = re.compile(
    r"(^|\.)(print|pprint|info|debug|warning|warn|log|log_dict|log_metrics|add_scalar|"
    r"set_postfix|set_description|write|format|echo)$"
)
_PASS_CALLS = {"int", "float", "max", "min", "round", "math.ceil", "math.floor", "ceil", "floor"}
_LOADER_WRAPPERS = {"enumerate", "iter", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "zip"}
_MAX_DEPTH = 4


# --- what the module configures -----------------------------------------------------------
@dataclass(eq=False)
class Configured:
    """K as an engine sees it: `value` is None when the engine gets no K in code."""

    engine: str
    kind: str  # "accelerate" | "guard" | "deepspeed"
    value: cst.BaseExpression | None
    known: bool  # False when the configuration is out of sight (`**kwargs`, a JSON file)

    @property
    def accumulates(self) -> bool | None:
        """True for K > 1 (or a K of unknown value), False for none or a literal 1."""
        if not self.known:
            return None
        if self.value is None:
            return False
        number = int_value(self.value)
        return number is None or number > 1


def configurations(model) -> dict[str, Configured]:
    return model.memo("accumulation.configured", _configurations)


def _configurations(model) -> dict[str, Configured]:
    found = {}
    for name, engine in model.setup.engines.items():
        if engine.kind in ("accelerate", "guard"):
            value = engine.accum
            if value is None and isinstance(engine.node, cst.Call):
                value = _positional_plugin_steps(model, engine.node)
            hidden = has_star_kwargs(engine.node) or _opaque_plugin(model, engine.node)
            known = value is not None or not hidden
            found[name] = Configured(name, engine.kind, value, known)
        elif engine.kind == "deepspeed":
            value = _deepspeed_k(model)
            found[name] = Configured(name, "deepspeed", value, value is not None)
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
    engines = [c for c in known.values() if c.kind in ("accelerate", "guard")]
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
    if depth > _MAX_DEPTH:
        return False
    if isinstance(node, cst.Call) and dotted(node.func) in _PASS_CALLS and positional(node):
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
    steps()`): the engine's own K, whatever it was configured to."""
    node = strip_parens(node)
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


# --- where K is read ------------------------------------------------------------------------
@dataclass(eq=False)
class Read:
    """One read of K. kind: "engine" (handed to an engine, trainer or config), "gate" (a
    modulus, a comparison, a `range`), "division" (of a loss or of gradients), "arithmetic"
    (step, learning-rate or batch arithmetic), "log" (printed or logged), "call" (given to a
    call the linter cannot see into), "alias" (bound to another name)."""

    kind: str
    node: cst.CSTNode
    stmt: Stmt
    target: str | None = None  # the name an arithmetic read is assigned to


def k_reads(model) -> list[Read]:
    return model.memo("accumulation.reads", _k_reads)


def _k_reads(model) -> list[Read]:
    reads = []
    for scope in model.scopes:
        for stmt in scope.stmts:
            reads.extend(_reads_in(model, stmt.node, stmt, _target(stmt)))
        for node, stmt in _headers(scope):
            for read in _reads_in(model, node, stmt, None):
                if read.kind in ("arithmetic", "alias"):
                    read.kind = "gate"  # a loop or `if` header decides what runs
                reads.append(read)
    divisors = _division_nodes(model)
    for read in reads:
        if read.kind == "arithmetic" and id(read.node) in divisors:
            read.kind = "division"
        elif read.kind == "arithmetic" and _only_logged(model, read):
            read.kind = "log"
    return reads


def _headers(scope: Scope):
    """(test or iterable, first statement inside) of each `if`/loop header of the scope."""
    seen = set()
    for stmt in scope.stmts:
        for frame in stmt.frames:
            if id(frame.node) in seen or frame.kind not in ("if", "loop"):
                continue
            seen.add(id(frame.node))
            node = frame.node
            header = node.iter if isinstance(node, cst.For) else getattr(node, "test", None)
            if header is not None:
                yield header, stmt


def _target(stmt: Stmt) -> str | None:
    node = stmt.node
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        return dotted(node.targets[0].target)
    if isinstance(node, (cst.AnnAssign, cst.AugAssign)):
        return dotted(node.target)
    return None


def _reads_in(model, root, stmt: Stmt, target: str | None) -> list[Read]:
    found = []
    stack = [(root, ())]
    while stack:
        node, parents = stack.pop()
        if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) and _is_read(
            node, parents
        ):
            if spells_k(model, node, stmt.scope, stmt.order):
                found.append(Read(_kind(model, node, parents), node, stmt, target))
                continue
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)) and parents:
            continue
        for child in children(node):
            stack.append((child, parents + (node,)))
    return found


def _is_read(node, parents) -> bool:
    """Not an attribute's or a call's inner part, not an assignment target, not a keyword."""
    if not parents:
        return True
    parent = parents[-1]
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return False
    if isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is node:
        return False
    if isinstance(parent, cst.Call) and parent.func is node:
        return False
    if isinstance(parent, cst.Arg) and parent.keyword is node:
        return False
    if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
        return getattr(parent, "target", None) is not node
    return not isinstance(parent, (cst.Param, cst.ImportAlias))


def _kind(model, node, parents) -> str:
    if any(_is_log(model, p) for p in parents):
        return "log"
    child = node
    for parent in reversed(parents):
        if isinstance(parent, cst.BinaryOperation):
            return "gate" if isinstance(parent.operator, cst.Modulo) else "arithmetic"
        if isinstance(parent, cst.Comparison):
            return "gate"
        if isinstance(parent, cst.Arg):
            if parent.keyword is not None and parent.keyword.value in _K_KEYS:
                return "engine"
        elif isinstance(parent, cst.DictElement):
            if string_value(parent.key) in _K_KEYS or is_k_name(string_value(parent.key)):
                return "engine"
            return "call"
        elif isinstance(parent, cst.Call) and child is not parent.func:
            name = dotted(parent.func) or ""
            if name in _PASS_CALLS:
                child = parent
                continue
            return "gate" if name == "range" else "call"
        elif isinstance(parent, (cst.Assign, cst.AnnAssign)):
            return "engine" if _k_key_target(parent) else "alias"
        elif isinstance(parent, cst.AugAssign):
            return "arithmetic"
        elif isinstance(parent, (cst.Return, cst.Yield, cst.Tuple, cst.List)):
            return "call"
        child = parent
    return "alias"


def _k_key_target(assign) -> bool:
    """`ds_config["gradient_accumulation_steps"] = K`."""
    targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else []
    return any(isinstance(t, cst.Subscript) and short_name(t) in _K_KEYS for t in targets)


def _is_log(model, node) -> bool:
    if isinstance(node, (cst.FormattedString, cst.ConcatenatedString)):
        return True
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return isinstance(node.left, (cst.SimpleString, cst.ConcatenatedString))
    if isinstance(node, cst.Call):
        name = dotted(node.func) or ""
        pair = method_call(node)
        if pair is not None and pair[1] == "format" and isinstance(pair[0], cst.SimpleString):
            return True
        return bool(_LOG_CALLS.search(name)) or "logger" in name or "wandb" in name
    return False


def _division_nodes(model) -> set[int]:
    """The divisors (and their parts) of every loss that reaches a backward, and of gradients
    divided in place (`p.grad /= K`, `p.grad.div_(K)`)."""
    found: set[int] = set()
    for sites in model.sites.values():
        for site in sites:
            nodes = []
            if site.kind in BACKWARD_KINDS:
                flow = model.flow(site)
                nodes = list(flow.divisors) if flow is not None else []
            elif site.kind == "grad_div":
                nodes = [site.stmt.node] if site.call is None else list(site.call.args)
            for node in nodes:
                found.update(id(sub) for sub in walk(node))
    return found


def _only_logged(model, read: Read) -> bool:
    """`total_batch = bs * K` read only to be printed: the arithmetic sizes nothing."""
    if read.target is None or "." in read.target:
        return False
    uses = [r for r in _name_reads(read.stmt.scope, read.target) if r is not read.stmt]
    return bool(uses) and all(_logs_name(model, stmt, read.target) for stmt in uses)


def _name_reads(scope: Scope, name: str) -> list[Stmt]:
    found = []
    for stmt in scope.stmts:
        if any(isinstance(n, cst.Name) and n.value == name for n in walk(stmt.node)):
            found.append(stmt)
    return found


def _logs_name(model, stmt: Stmt, name: str) -> bool:
    """Every read of `name` in the statement sits inside a print or log call."""
    return not [
        r for r in _name_nodes(stmt.node, name, ()) if not any(_is_log(model, p) for p in r)
    ]


def _name_nodes(node, name: str, parents):
    if isinstance(node, cst.Name) and node.value == name:
        yield parents
        return
    for child in children(node):
        yield from _name_nodes(child, name, parents + (node,))


# --- accumulate() entries, backward calls per entry, loaders -------------------------------
def accumulate_regions(model) -> list[Region]:
    return [r for r in model.regions if r.kind == "accumulate"]


def innermost_loop(frames: tuple[Frame, ...]) -> cst.CSTNode | None:
    loops = [f.node for f in frames if f.kind == "loop"]
    return loops[-1] if loops else None


def frames_before(frames: tuple[Frame, ...], node: cst.CSTNode) -> tuple[Frame, ...]:
    for i, frame in enumerate(frames):
        if frame.node is node:
            return frames[:i]
    return frames


def exclusive(a: tuple[Frame, ...], b: tuple[Frame, ...]) -> bool:
    """Whether no iteration runs both: an `if` (or an early exit) puts them on opposite sides."""
    sides = {id(f.node): f.holds for f in a if f.kind in ("if", "exit")}
    return any(sides.get(id(f.node), f.holds) != f.holds for f in b if f.kind in ("if", "exit"))


def callers(model) -> dict[int, list[CallSite]]:
    """id(scope) -> the module's calls of that function (direct calls only)."""
    return model.memo("accumulation.callers", _callers)


def _callers(model) -> dict[int, list[CallSite]]:
    found: dict[int, list[CallSite]] = {}
    for call in model.calls:
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is not None:
            found.setdefault(id(callee), []).append(call)
    return found


def entered_accumulate(model, stmt: Stmt, depth: int = 0) -> bool:
    """Whether `stmt` runs inside an `accumulate()` block, in its own function or in a caller
    that calls its function from inside one."""
    if model.regions_around(stmt, "accumulate"):
        return True
    if depth >= _MAX_DEPTH or not isinstance(stmt.scope.node, cst.FunctionDef):
        return False
    calls = callers(model).get(id(stmt.scope), [])
    return any(entered_accumulate(model, c.stmt, depth + 1) for c in calls)


def enters_accumulate(model, scope: Scope) -> bool:
    """Whether a function enters `accumulate()` itself (a training-step helper)."""
    return any(r.frames and _scope_of(model, r) is scope for r in accumulate_regions(model))


def _scope_of(model, region: Region) -> Scope | None:
    for scope in model.scopes:
        if any(w is region.with_node for w, _ in scope.withs):
            return scope
    return None


def region_scope(model, region: Region) -> Scope | None:
    return _scope_of(model, region)


def loader_state(model, expr: cst.BaseExpression, scope: Scope, order: int, depth: int = 0) -> str:
    """ "prepared", "unprepared" (visibly a `DataLoader(...)` that never went through
    `prepare`), "range" (not a loader: `range`, `itertools.count`) or "unknown"."""
    expr = strip_parens(expr)
    if depth > _MAX_DEPTH:
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
    if name in ("prepare", "prepare_data_loader"):
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
    """`next(it)` calls in an iteration of `loop` (its own body, not an inner loop)."""
    return [
        c
        for c in scope.calls
        if c.func == "next" and innermost_loop(c.stmt.frames) is loop and c.call.args
    ]


# --- what --show-loops prints -------------------------------------------------------------
def describe_loop(model, loop) -> dict:
    """The accumulation facts the ACL302/306/309/311/313 checks use, for one training loop."""
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
        "k_reads": sorted({r.kind for r in k_reads(model)}),
    }
