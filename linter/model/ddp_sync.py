"""DDP gradient sync: `no_sync()` regions (inline, conditional or held in a name), sync toggles
(`require_backward_grad_sync`), communication hooks, and whether a toggle can be true on the
step."""

from __future__ import annotations

from dataclasses import dataclass
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
    string_value,
    walk,
)
from linter.model.functions import Def, Scope
from linter.model.kinds import FrameKind, GateKind, RegionKind

if TYPE_CHECKING:
    from linter.model import Model, TrainingLoop
from linter.model.ddp_models import DDPModel, ddp_held_by, forward_calls, inside, loop_calls

# + FSDP2's switch and Lightning Fabric's `no_backward_sync(model, enabled=...)`
_SYNC_WORDS = {
    "no_sync",
    "require_backward_grad_sync",
    "set_requires_gradient_sync",
    "no_backward_sync",
}

_CONTEXT_DECORATORS = {"contextlib.contextmanager", "contextmanager"}

# Libraries whose context managers do not switch DDP's sync (a call of theirs handed the model
# is not a sync switch we cannot see into).
_KNOWN_CONTEXTS = ("torch.", "contextlib.")


# no_sync regions and sync toggles --------------------------------------------------------
@dataclass(eq=False)
class NoSync:
    """A `with` whose context is (or may be) a `no_sync()`: `model.no_sync()`,
    `accelerator.no_sync(model)`, `nullcontext() if last else model.no_sync()`."""

    with_node: cst.With
    item: cst.WithItem
    call: cst.Call  # the no_sync() call itself
    conditional: bool  # one arm of a conditional expression
    target: str | None  # the model it is for
    frames: tuple = ()  # the frames of the block's statements (the `with` included)
    bound: Def | None = None  # `ctx = <context>` when the `with` enters a name (`with ctx:`)
    # Another engine's switch handed the model (ColossalAI's `booster.no_sync(model, opt)`):
    # not DDP's module method nor Accelerate's wrapper of it (see `strategy_decides`).
    foreign_engine: bool = False

    @property
    def strategy_decides(self) -> bool:
        """Fabric's `no_backward_sync` or another engine's own switch: the strategy picks what
        it turns off (DDP's `no_sync`, read in the forward; FSDP's or a ZeRO optimizer's, read
        in the backward), so a block around the backward only may be right."""
        pair = method_call(self.call)
        return self.foreign_engine or (pair is not None and pair[1] == "no_backward_sync")

    @property
    def where(self) -> cst.CSTNode:
        """Where to report: the `no_sync()` call, or the name in `with ctx:`."""
        return self.call if self.bound is None else self.item.item

    def spelled(self, line: int) -> str:
        """How a message names the region (`line`: the line of the name's binding)."""
        if self.bound is None:
            return f"`{code(self.call)}`"
        name = code(self.item.item)
        verb = "may be" if self.conditional else "is"
        return f"`with {name}:` (`{name}` {verb} `{code(self.call)}`, line {line})"


def no_sync_regions(model: Model, scope: Scope) -> list[NoSync]:
    found = []
    for with_node, frames in scope.withs:
        for item in with_node.items:
            contexts = _entered(model, item.item, scope, frames)
            for context, bound in contexts:
                for node, conditional in _context_calls(context, len(contexts) > 1):
                    enters, target, maybe = _no_sync_target(node)
                    if not enters:
                        enters, target, maybe = _helper_no_sync(model, node, scope)
                    conditional = conditional or maybe
                    if enters:
                        region = NoSync(with_node, item, node, conditional, target, frames, bound)
                        region.foreign_engine = _foreign_engine_switch(model, node, scope)
                        found.append(region)
    return found


def _foreign_engine_switch(model: Model, call: cst.Call, scope: Scope) -> bool:
    """`x.no_sync(model, ...)` on a receiver that is not an Accelerator or guard engine (whose
    `no_sync(model)` is DDP's): an engine of its own, whose switch the linter cannot read."""
    pair = method_call(call)
    if pair is None or pair[1] != "no_sync" or not call.args:
        return False
    receiver = dotted(pair[0])
    engine = model.roles.engine_for(receiver, scope)
    return receiver is not None and engine is None


def _entered(model: Model, expr, scope: Scope, frames: tuple) -> list[tuple]:
    """(context, the binding it comes from) for each context a `with` may enter: `with ctx:`
    after `ctx = nullcontext() if last else model.no_sync()` enters that value (the region
    code resolves `with ctx:` for autocast alike). Bindings in branches the `with` is not in
    are alternatives, back to one that always runs before it."""
    text = dotted(expr)
    if text is None:
        return [(expr, None)]
    body = [s.order for s in scope.stmts if frames[-1] in s.frames]
    defs = scope.defs_before(text, min(body)) if body else []
    if not defs and text not in scope.defs and text not in scope.params:
        defs = model.module_defs(text)
    found = []
    for d in reversed(defs):
        if d.op != "=" or d.tuple_index is not None:
            break
        found.append((d.value, d))
        if d.stmt.scope is scope and _dominates(d.stmt.frames, frames):
            break
    return found or [(expr, None)]


def _dominates(binding: tuple, block: tuple) -> bool:
    """A binding whose frames all surround the block runs on every path to it."""
    return block[: len(binding)] == binding


def _context_calls(node, conditional: bool):
    if isinstance(node, cst.IfExp):
        yield from _context_calls(node.body, True)
        yield from _context_calls(node.orelse, True)
    elif isinstance(node, cst.Call):
        yield node, conditional


def mentions_sync_control(model: Model, loop: TrainingLoop) -> bool:
    """Whether the loop controls DDP's gradient sync in any way: `no_sync`,
    `require_backward_grad_sync` or FSDP2's `set_requires_gradient_sync` in its body (an
    `ExitStack`, a conditional context), in a module function it calls, or in a name it reads
    (`ctx = model.no_sync if ... else ...`)."""
    if _mentions(loop.node):
        return True
    if any(inside_loop(r.frames, loop) for r in no_sync_regions(model, loop.scope)):
        return True  # a context manager of the module that enters `no_sync`
    if _opaque_context(model, loop):
        return True
    if isinstance(loop.node, cst.FunctionDef) and _caller_controls_sync(model, loop.scope):
        return True
    for c in loop_calls(model, loop):
        callee = model.local_function(c.call.func, c.stmt.scope)
        if callee is not None and _mentions(callee.node):
            return True
    read = {n.value for n in walk(loop.node) if isinstance(n, cst.Name)}
    scope = loop.scope
    while scope is not None:
        for name in read:
            if any(d.value is not None and _mentions(d.value) for d in scope.defs.get(name, ())):
                return True
        scope = scope.parent
    return False


def inside_loop(frames: tuple, loop: TrainingLoop) -> bool:
    """Frames of a statement in the loop's body (any statement when the function is the loop)."""
    return isinstance(loop.node, cst.FunctionDef) or any(f.node is loop.node for f in frames)


def _opaque_context(model: Model, loop: TrainingLoop) -> bool:
    """A `with helper(ddp, ...):` around a DDP model's forward and a backward, whose helper this
    module cannot read (`misc.ddp_sync(ddp, sync=...)` from another module of the project): it
    may enter `no_sync`, so the loop is not known to miss it."""
    for with_node, frames in loop.scope.withs:
        if not inside_loop(frames, loop):
            continue
        for item in with_node.items:
            call = item.item
            if not isinstance(call, cst.Call) or _readable(model, call, loop.scope):
                continue
            qual = model.imports.qualify(call.func) or ""
            if qual.startswith(_KNOWN_CONTEXTS):
                continue
            handed = [
                held
                for arg in call.args
                if (held := ddp_held_by(model, dotted(arg.value), loop.scope)) is not None
            ]
            body = model.calls_in_with(with_node)
            wraps_backward = any(
                any(f.node is with_node for f in s.stmt.frames) for s in loop.backwards
            )
            if wraps_backward and any(forward_calls(model, body, held) for held in handed):
                return True
    return False


def _readable(model: Model, call: cst.Call, scope: Scope) -> bool:
    """A function or class of this module (what it enters is known)."""
    if model.local_function(call.func, scope) is not None:
        return True
    return dotted(call.func) in model.class_names


def _caller_controls_sync(model: Model, scope: Scope) -> bool:
    """A per-batch function whose callers run it under `accumulate()` or in a loop that
    controls the sync (`sync_context = partial(accelerator.no_sync, model=model)`)."""
    for call in model.graph.callers(scope):
        if model.regions_around(call.stmt, RegionKind.ACCUMULATE):
            return True
        loops = call.stmt.loops()
        if loops and _mentions(loops[-1]):
            return True
        names = {n.value for n in walk(loops[-1]) if isinstance(n, cst.Name)} if loops else set()
        defs = [d for name in names for d in call.stmt.scope.defs.get(name, ())]
        if any(d.value is not None and _mentions(d.value) for d in defs):
            return True
    return False


def _mentions(node: cst.CSTNode) -> bool:
    """`.no_sync` / `.require_backward_grad_sync`, also spelled as a string
    (`getattr(model, "no_sync", nullcontext)`, `hasattr(model, "no_sync")`)."""
    for n in walk(node, into_scopes=True):
        if isinstance(n, cst.Attribute) and n.attr.value in _SYNC_WORDS:
            return True
        if isinstance(n, cst.SimpleString) and string_value(n) in _SYNC_WORDS:
            return True
    return False


def _no_sync_target(call: cst.Call) -> tuple[bool, str | None, bool]:
    """(whether the call enters `no_sync`, the model it is for, whether only on some calls):
    `m.no_sync()`, `accelerator.no_sync(m)`, `getattr(m, "no_sync", nullcontext)()`, Lightning
    Fabric's `fabric.no_backward_sync(m, enabled=is_accumulating)` (a no-op when not enabled)."""
    pair = method_call(call)
    if pair is not None and pair[1] == "no_sync":
        args = positional(call)
        return True, dotted(args[0]) if args else dotted(pair[0]), False
    if pair is not None and pair[1] == "no_backward_sync":
        args = positional(call)
        enabled = keyword(call, "enabled")
        if enabled is None and len(args) > 1:
            enabled = args[1]
        if not args or is_false(enabled):
            return False, None, False
        return True, dotted(args[0]), not (enabled is None or dotted(enabled) == "True")
    inner = call.func
    if isinstance(inner, cst.Call) and dotted(inner.func) == "getattr":
        args = positional(inner)
        if len(args) >= 2 and string_value(args[1]) == "no_sync":
            return True, dotted(args[0]), False
    return False, None, False


# context managers of the module that enter `no_sync` -------------------------------------------
def _helper_no_sync(model: Model, call: cst.Call, scope: Scope) -> tuple[bool, str | None, bool]:
    """A context manager this module defines (a `@contextmanager` function, a class with
    `__enter__`, or a function that returns one) that enters `no_sync` on a parameter: (True,
    the argument this call passes for it, whether the helper enters it only on some paths), as
    NVlabs' `ddp_sync(module, sync)` does (`if sync: yield` else `with module.no_sync():
    yield`), or `def sync_context(m, last): return nullcontext() if last else m.no_sync()`."""
    helper = _context_helper(model, call, scope)
    if helper is None:
        return False, None, False
    methods, binder, entered = helper
    for method in methods:
        for site, conditional in _no_sync_sites(model, method, entered):
            _, target, maybe = _no_sync_target(site)
            param = _param_of(target, binder)
            argument = _argument_for(call, binder, param) if param else None
            if argument is not None:
                return True, dotted(argument), conditional or maybe
    return False, None, False


def _context_helper(model: Model, call: cst.Call, scope: Scope):
    """([scopes whose code runs on entry], the scope whose parameters the call binds, whether
    it is entered itself: a `@contextmanager` or a class, not a function returning a context)."""
    function = model.local_function(call.func, scope)
    if function is not None:
        decorators = function.node.decorators
        names = {model.imports.qualify(_decorator_name(d)) for d in decorators}
        # a function of the module: it enters what it yields in, or what it returns
        return [function], function, bool(names & _CONTEXT_DECORATORS)
    name = dotted(call.func)
    if name is None or name not in model.class_names:
        return None
    methods = [s for s in model.function_defs.get("__enter__", ()) if s.class_name == name]
    inits = [s for s in model.function_defs.get("__init__", ()) if s.class_name == name]
    if not methods:
        return None
    return methods, (inits[0] if inits else methods[0]), True


def _decorator_name(decorator: cst.Decorator) -> cst.BaseExpression:
    node = decorator.decorator
    return node.func if isinstance(node, cst.Call) else node


def _no_sync_sites(model: Model, scope: Scope, entered: bool):
    """(`no_sync`-entering call, whether on some paths only) in a helper: its `with m.no_sync():`
    items and calls (`entered`: a `@contextmanager` or `__enter__`), else what it returns."""
    if not entered:
        for returned, _ in scope.returns:
            for node, conditional in _context_calls(returned, len(scope.returns) > 1):
                if _no_sync_target(node)[0]:
                    yield node, conditional
        return
    for with_node, frames in scope.withs:
        for item in with_node.items:
            if isinstance(item.item, cst.Call) and _no_sync_target(item.item)[0]:
                yield item.item, _on_some_paths(frames)
    for c in scope.calls:
        if _no_sync_target(c.call)[0]:
            yield c.call, _on_some_paths(c.stmt.frames)


def _on_some_paths(frames: tuple) -> bool:
    return any(f.kind in (FrameKind.IF, FrameKind.EXIT) for f in frames)


def _param_of(target: str | None, binder: Scope) -> str | None:
    """The parameter `target` is: itself, or `self.<attr>` that `__init__` sets from one."""
    if target is None:
        return None
    if target in binder.params and target not in ("self", "cls"):
        return target
    for d in binder.defs.get(target, ()) if target.startswith("self.") else ():
        source = dotted(d.value) if d.op == "=" and d.tuple_index is None else None
        if source in binder.params:
            return source
    return None


def _argument_for(call: cst.Call, binder: Scope, param: str) -> cst.BaseExpression | None:
    """The expression a call passes for `param` (methods are called without their `self`)."""
    names = list(binder.params)
    if binder.class_name is not None and names and names[0] in ("self", "cls"):
        names = names[1:]
    by_keyword = keyword(call, param)
    if by_keyword is not None:
        return by_keyword
    args = positional(call)
    position = names.index(param) if param in names else -1
    return args[position] if 0 <= position < len(args) else None


def syncs_each_batch(model: Model) -> bool:
    """`sync_each_batch=True` (an explicit choice to all-reduce every micro-step)."""
    return model.memo("sync_each_batch", _sync_each_batch)


def _sync_each_batch(model: Model) -> bool:
    return any(
        (value := keyword(c.call, "sync_each_batch")) is not None and not is_false(value)
        for c in model.calls
    )


def sync_toggles(model: Model, loop: TrainingLoop) -> list[tuple[Def, DDPModel]]:
    """`<ddp>.require_backward_grad_sync = <expr>` assignments in the loop."""
    found = []
    for name, defs in loop.scope.defs.items():
        if not name.endswith(".require_backward_grad_sync"):
            continue
        held = ddp_held_by(model, name.rsplit(".", 1)[0], loop.scope)
        for d in defs:
            if held is not None and d.op == "=" and inside(d.stmt, loop.node):
                found.append((d, held))
    return found


def has_comm_hook(model: Model) -> bool:
    """A registered communication hook decides itself how gradients are combined (a summing
    hook makes a 1/W on the loss necessary)."""
    return model.memo("comm_hook", lambda m: any(c.method == "register_comm_hook" for c in m.calls))


def reduces_gradients_by_hand(model: Model, scope: Scope) -> bool:
    """`dist.all_reduce(p.grad)` in the function: manual gradient averaging, where 1/W is due."""
    for c in scope.calls:
        if last_part(c.func) == "all_reduce" and c.call.args:
            if ".grad" in code(c.call.args[0].value):
                return True
    return False


# evaluating a sync flag ------------------------------------------------------------------
def never_true_on_step(model: Model, loop: TrainingLoop, expr: cst.BaseExpression) -> bool:
    """Whether a `require_backward_grad_sync` value is False on every micro-step that steps the
    optimizer (`micro_step == K` in `for micro_step in range(K)`). Only what can be evaluated
    counts: a literal, the micro-step index against K, or the loop index under a `% K` gate, for
    K in a few sample values; anything else may be True."""
    if is_false(expr):
        return True
    gate = loop.gate
    if gate is None or gate.k is None:
        return False
    k_text = code(gate.k)
    for k in (2, 3, 8):
        steps = _step_environments(loop, gate, k_text, k)
        if steps is None:
            return False
        values = [_evaluate(expr, env) for env in steps]
        if any(v is None or v for v in values):
            return False
    return True


def _step_environments(loop: TrainingLoop, gate, k_text: str, k: int) -> list[dict] | None:
    """Values of the loop's index on the micro-steps that step, for K = k."""
    if gate.kind == GateKind.MICRO_LOOP:
        index = range_index(gate.node)
        return [{index: k - 1, k_text: k}] if index else None
    if gate.kind != GateKind.MODULO or gate.test is None:
        return None
    index = _loop_index(loop.node)
    if index is None:
        return None
    envs = []
    for i in range(4 * k):
        env = {index: i, k_text: k}
        holds = _evaluate(gate.test, env)
        if holds is None:
            return None
        if bool(holds) == gate.holds:
            envs.append(env)
    return envs


def range_index(node) -> str | None:
    """`v` of `for v in range(K)`."""
    if not isinstance(node, cst.For) or not isinstance(node.target, cst.Name):
        return None
    call = node.iter
    if isinstance(call, cst.Call) and dotted(call.func) == "range" and len(call.args) == 1:
        return node.target.value
    return None


def _loop_index(node) -> str | None:
    """`i` of `for i, batch in enumerate(dl)` or `for i in range(n)`."""
    if not isinstance(node, cst.For):
        return None
    call, target = node.iter, node.target
    name = dotted(call.func) if isinstance(call, cst.Call) else None
    if name == "enumerate" and isinstance(target, cst.Tuple) and len(call.args) == 1:
        first = target.elements[0].value
        return first.value if isinstance(first, cst.Name) else None
    if name == "range" and isinstance(target, cst.Name):
        return target.value
    return None


_ARITHMETIC = {
    cst.Add: lambda a, b: a + b,
    cst.Subtract: lambda a, b: a - b,
    cst.Multiply: lambda a, b: a * b,
    cst.FloorDivide: lambda a, b: a // b if b else None,
    cst.Modulo: lambda a, b: a % b if b else None,
}


_COMPARE = {
    cst.Equal: lambda a, b: a == b,
    cst.NotEqual: lambda a, b: a != b,
    cst.LessThan: lambda a, b: a < b,
    cst.LessThanEqual: lambda a, b: a <= b,
    cst.GreaterThan: lambda a, b: a > b,
    cst.GreaterThanEqual: lambda a, b: a >= b,
}


def _evaluate(node, env: dict):
    """The value of a small integer/boolean expression, or None when it reads anything else."""
    if isinstance(node, cst.Integer):
        return int(node.value.replace("_", ""), 0)
    text = dotted(node)
    if text is not None:
        return {"True": True, "False": False}.get(text, env.get(text))
    if isinstance(node, cst.BinaryOperation) and type(node.operator) in _ARITHMETIC:
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        if left is None or right is None:
            return None
        return _ARITHMETIC[type(node.operator)](left, right)
    if isinstance(node, cst.UnaryOperation):
        value = _evaluate(node.expression, env)
        if value is None:
            return None
        return (not value) if isinstance(node.operator, cst.Not) else -value
    if isinstance(node, cst.BooleanOperation):
        left, right = _evaluate(node.left, env), _evaluate(node.right, env)
        if left is None or right is None:
            return None
        return (left and right) if isinstance(node.operator, cst.And) else (left or right)
    if isinstance(node, cst.Comparison):
        return _compare(node, env)
    return None


def _compare(node: cst.Comparison, env: dict):
    left = _evaluate(node.left, env)
    result = True
    for target in node.comparisons:
        right = _evaluate(target.comparator, env)
        if left is None or right is None or type(target.operator) not in _COMPARE:
            return None
        result = result and _COMPARE[type(target.operator)](left, right)
        left = right
    return result
