"""Parameter dtypes: which models are cast to fp16 / bf16 (`.half()`, `.to(torch.float16)`,
`.to(dtype=...)`, `torch_dtype=...`), whether their parameters reach an optimizer, and whether
they are frozen (`requires_grad_(False)`, a loop that turns `requires_grad` off, an adapter
wrapper; the last switch before training wins, so a later `requires_grad_(True)` unfreezes).
Read by ACL107; the dtype words are those of `linter.model.precision`.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from linter.model.cst_util import (
    children,
    code,
    dotted,
    is_false,
    last_part,
    method_call,
    walk,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Stmt
from linter.model.kinds import BuiltKind, FrameKind
from linter.model.precision import BF16, DTYPES, FP16, FP32, engines
from linter.model.setup import built_kind

_CAST_METHODS = {"half": FP16, "bfloat16": BF16}
_PARAMETER_METHODS = {"parameters", "named_parameters"}
# Module methods that work in place and return the module (`model.to(d).half()`).
_MODULE_METHODS = {"to", "half", "bfloat16", "float", "cuda", "cpu", "requires_grad_", "train"}
_ADAPTERS = {"get_peft_model", "PeftModel.from_pretrained"}


@dataclass(eq=False)
class ParamCast:
    """A model whose parameters are cast to a low-precision dtype."""

    name: str  # the model, as the module names it
    dtype: str  # FP16 / BF16
    node: cst.CSTNode  # the cast: `half`, the dtype argument, or the `torch_dtype=` keyword
    stmt: Stmt
    trained: bool  # its parameters reach an optimizer
    frozen: bool  # `requires_grad_(False)`, gradients turned off in a loop, or an adapter wrapper


@dataclass(frozen=True)
class _GradSwitch:
    """A statement that turns a model's gradients off (`requires_grad_(False)`, a loop setting
    `p.requires_grad = False`, an adapter wrapper) or back on (`requires_grad_(True)`)."""

    stmt: Stmt
    frozen: bool


def param_casts(model) -> list[ParamCast]:
    return model.memo("precision.param_casts", _build_param_casts)


def accumulates(model) -> bool:
    """Whether gradients are accumulated over K > 1 micro-steps (an engine's value, or a step
    gate's K, other than the literal 1)."""
    values = [e.accum for e in engines(model) if e.accum is not None]
    values += [loop.gate.k for loop in model.loops if loop.gate is not None]
    numbers = [model.fixed_int(k) for k in values if k is not None]
    return any(number is None or number > 1 for number in numbers)


def _build_param_casts(model) -> list[ParamCast]:
    trained = _trained_names(model)
    switches = grad_switches(model)
    found = []
    for scope in model.scopes:
        for stmt in scope.stmts:
            target, chain = _cast_chain(stmt)
            cast = _low_precision_cast(model, chain) if target is not None else None
            if cast is None:
                continue
            reaches = any(_sees(scope, user, target) for user in trained.get(target, ()))
            reaches = reaches and not _after_training(model, stmt)
            frozen = _frozen_for(model, switches.get(target, []), stmt)
            found.append(ParamCast(target, cast[0], cast[1], stmt, reaches, frozen))
    return found


def _frozen_for(model, switches: list[_GradSwitch], cast: Stmt) -> bool:
    """Whether the cast model is frozen when training starts: the last switch of the cast's
    function before its first training loop (or the cast itself, when later) wins, as Python
    runs them (`requires_grad_(False)` early, `requires_grad_(True)` later trains it). Switches
    only elsewhere (a helper, inside the loop): any freeze counts."""
    starts = [s.stmt.order for loop in model.loops if loop.scope is cast.scope for s in loop.sites]
    limit = max(min(starts, default=float("inf")), cast.order)
    local = [w for w in switches if w.stmt.scope is cast.scope and w.stmt.order <= limit]
    if local:
        return max(local, key=lambda w: w.stmt.order).frozen
    return any(w.frozen for w in switches)


def _sees(cast_scope, optimizer_scope, name: str) -> bool:
    """Whether the optimizer built in `optimizer_scope` gets the object that `cast_scope` casts:
    the same function, an enclosing one (the module), or `self.X` in the same class. A model
    cast in an evaluation function of its own is another object."""
    if name.startswith("self."):
        return cast_scope.class_name is not None and cast_scope.class_name == (
            optimizer_scope.class_name
        )
    scope = optimizer_scope
    while scope is not None:
        if scope is cast_scope:
            return True
        scope = scope.parent
    return False


def _after_training(model, stmt: Stmt) -> bool:
    """A cast outside any loop after every training loop of its function (`if do_predict:
    model.half()` at the end of `main()`): for evaluation or export, not for training."""
    if stmt.loops():
        return False
    ends = [s.stmt.order for loop in model.loops if loop.scope is stmt.scope for s in loop.sites]
    return bool(ends) and stmt.order > max(ends)


def _cast_chain(stmt: Stmt) -> tuple[str | None, list[cst.Call]]:
    """(the model a statement casts, the calls of its method chain): `m = Net().to(d).half()`
    casts `m`; `m.half()` and `m.to(torch.float16)` cast `m` in place."""
    node = stmt.node
    if isinstance(node, (cst.Assign, cst.AnnAssign)):
        targets = node.targets if isinstance(node, cst.Assign) else [node]
        if len(targets) != 1 or dotted(targets[0].target) is None:
            return None, []
        return dotted(targets[0].target), _chain(node.value)
    if isinstance(node, cst.Expr):
        chain = _chain(node.value)
        pair = method_call(chain[-1]) if chain else None
        if pair is not None and pair[1] in _MODULE_METHODS and dotted(pair[0]) is not None:
            return dotted(pair[0]), chain
    return None, []


def _chain(value: cst.BaseExpression | None) -> list[cst.Call]:
    """The calls of `a(...).b(...).c(...)`, outermost first."""
    calls = []
    while isinstance(value, cst.Call):
        calls.append(value)
        value = value.func.value if isinstance(value.func, cst.Attribute) else None
    return calls


def _low_precision_cast(model, chain: list[cst.Call]) -> tuple[str, cst.CSTNode] | None:
    """The dtype the chain leaves the parameters in, when low (the outermost cast wins:
    `model.half().float()` ends in fp32), with the node that sets it."""
    for call in chain:
        found = _cast_of(model, call)
        if found is not None:
            return found if found[0] in (FP16, BF16) else None
    return None


def _cast_of(model, call: cst.Call) -> tuple[str, cst.CSTNode] | None:
    pair = method_call(call)
    method = pair[1] if pair else None
    if method in _CAST_METHODS and not call.args:
        return _CAST_METHODS[method], call.func.attr
    if method in ("float", "double") and not call.args:
        return FP32, call
    if method == "to":
        for arg in [a.value for a in call.args if _dtype_argument(a)]:
            dtype = DTYPES.get(model.imports.qualify(arg) or "")
            if dtype is not None:
                return dtype, arg
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "torch_dtype":
            dtype = DTYPES.get(model.imports.qualify(arg.value) or "")
            if dtype is not None:
                return dtype, arg
    return None


def _dtype_argument(arg: cst.Arg) -> bool:
    return arg.keyword is None or arg.keyword.value == "dtype"


def _trained_names(model) -> dict[str, list]:
    """Names whose parameters reach an optimizer, with the functions that build those
    optimizers: the names in an optimizer's arguments (`model.parameters()`, param groups), and
    those bound to them (`params = model.parameters()`)."""
    return model.memo("precision.trained", _build_trained)


def _build_trained(model) -> dict[str, list]:
    found: dict[str, list] = {}
    for site in model.calls:
        if not _is_optimizer_call(model, site):
            continue
        seen: set[str] = set()
        pending = [(a.value, 0) for a in site.call.args]
        while pending:
            node, depth = pending.pop()
            for text in _dotted_names(node):
                if text in seen or depth >= FOLLOW_DEPTH:
                    continue
                seen.add(text)  # a model handed over whole (`groups(model)`), or a name to resolve
                found.setdefault(text, []).append(site.stmt.scope)
                pending.extend((d.value, depth + 1) for d in model.module_defs(text) if d.value)
    return found


def _dotted_names(node: cst.CSTNode):
    """The whole dotted names in an expression (`self.model` in `self.model.parameters()`,
    with `.parameters` dropped), not their parts."""
    stack = [node]
    while stack:
        current = stack.pop()
        text = dotted(current)
        if text is not None:
            head, _, method = text.rpartition(".")
            yield head if method in _PARAMETER_METHODS and head else text
            continue
        stack.extend(children(current))


def _is_optimizer_call(model, site) -> bool:
    """A plain optimizer's construction: a torch / transformers / bitsandbytes / timm class or
    factory, or a name bound to one (`optimizer_class = torch.optim.AdamW`). A project's own or
    a fused optimizer (apex's, NVIDIA's `FusedLAMBAMP`, `get_optimizer(model, args)`) may keep
    fp32 master weights and take the scaler itself: it is left to the runtime check."""
    qual = model.imports.qualify(site.call.func) or ""
    if built_kind(qual) == BuiltKind.OPTIMIZER:
        return True
    values = [d.value for d in model.module_defs(dotted(site.call.func) or "") if d.value]
    return any(
        built_kind(model.imports.qualify(sub) or "") == BuiltKind.OPTIMIZER
        for value in values
        for sub in walk(value)
        if isinstance(sub, cst.Attribute | cst.Name)
    )


def frozen_names(model) -> set[str]:
    """Models that some function leaves frozen: its last gradient switch of the model is a
    freeze (see `grad_switches`)."""
    found = set()
    for name, switches in grad_switches(model).items():
        last: dict[int, _GradSwitch] = {}
        for switch in switches:
            last[id(switch.stmt.scope)] = switch  # statement order within each function
        if any(switch.frozen for switch in last.values()):
            found.add(name)
    return found


def grad_switches(model) -> dict[str, list[_GradSwitch]]:
    """Per model name, the statements that freeze or unfreeze it, in statement order."""
    return model.memo("precision.grad_switches", _build_switches)


def _build_switches(model) -> dict[str, list[_GradSwitch]]:
    """`requires_grad_(False / True)` (chained or on its own line), a loop over `.parameters()`
    that sets `requires_grad` unconditionally, or an adapter wrapper (`get_peft_model`) whose
    trainable weights are created in fp32 (a freeze)."""
    found: dict[str, list[_GradSwitch]] = {}
    for scope in model.scopes:
        for stmt in scope.stmts:
            target, chain = _cast_chain(stmt)
            for call in reversed(chain):  # innermost first: `.requires_grad_(False).half()`
                frozen = _switches(model, call)
                if frozen is not None:
                    found.setdefault(target, []).append(_GradSwitch(stmt, frozen))
            looped = _loop_switch(stmt)
            if looped is not None:
                found.setdefault(looped[0], []).append(_GradSwitch(stmt, looped[1]))
    return found


def _switches(model, call: cst.Call) -> bool | None:
    """True for a freeze, False for an unfreeze (`requires_grad_()`, `requires_grad_(True)`)."""
    pair = method_call(call)
    if pair and pair[1] == "requires_grad_":
        if not call.args:
            return False
        value = call.args[0].value
        if is_false(value):
            return True
        return False if isinstance(value, cst.Name) and value.value == "True" else None
    if last_part(model.imports.qualify(call.func)) in _ADAPTERS or code(call.func) in _ADAPTERS:
        return True
    return None


def _loop_switch(stmt: Stmt) -> tuple[str, bool] | None:
    """(`X`, frozen) for `p.requires_grad = False / True` directly in the body of
    `for p in X.parameters():` (not under an `if`: a loop that freezes only some layers)."""
    node = stmt.node
    if (
        not isinstance(node, cst.Assign)
        or not stmt.frames
        or stmt.frames[-1].kind != FrameKind.LOOP
    ):
        return None
    if not any(
        isinstance(t.target, cst.Attribute) and t.target.attr.value == "requires_grad"
        for t in node.targets
    ):
        return None
    loop = stmt.frames[-1].node
    if not isinstance(loop, cst.For):
        return None
    pair = method_call(loop.iter)
    if pair is None or pair[1] not in _PARAMETER_METHODS or dotted(pair[0]) is None:
        return None
    if is_false(node.value):
        return dotted(pair[0]), True
    if isinstance(node.value, cst.Name) and node.value.value == "True":
        return dotted(pair[0]), False
    return None
