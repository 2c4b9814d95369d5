"""DDP-wrapped models: which names hold a `DistributedDataParallel` (under any alias, built by a
helper, or `self.model` of a class), and which calls in a loop run their forward."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    dotted,
    last_part,
    method_call,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.evaluates import constructions
from linter.model.functions import CallSite, Def, Scope, Stmt
from linter.model.kinds import FrameKind

if TYPE_CHECKING:
    from linter.model import Model, TrainingLoop


_DDP_CLASSES = {"DistributedDataParallel", "DDP"}


# Wrappers named like DDP that have no `no_sync()` or do not all-reduce in DDP's hooks.
_NOT_TORCH_DDP = {"apex", "fairscale", "horovod", "deepspeed"}


# An imported helper that wraps a model in DDP (YOLOv5's `smart_DDP`, `wrap_ddp`).
_DDP_HELPER = re.compile(r"(^|_)ddp$", re.I)


_FORWARD_HELPER = re.compile(r"loss|forward|step|train|run|batch", re.I)


@dataclass(eq=False)
class DDPModel:
    """A name bound to `DistributedDataParallel(...)` (directly, in one arm of a conditional,
    or through a same-module helper that returns one)."""

    name: str
    call: cst.Call
    scope: Scope
    bound: Def


# DDP models ---------------------------------------------------------------------------------
def is_ddp_call(model: Model, node: cst.CSTNode | None) -> bool:
    """`DistributedDataParallel(...)` / `DDP(...)` of torch, under any import alias, or an
    imported helper named for it (`smart_DDP(model)`). FSDP, DeepSpeed, apex and fairscale
    wrappers are other engines."""
    if not isinstance(node, cst.Call):
        return False
    qual = model.imports.qualify(node.func) or ""
    if qual.split(".", 1)[0] in _NOT_TORCH_DDP:
        return False
    if last_part(qual) in _DDP_CLASSES:
        return True
    return model.imports.is_imported(node.func) and bool(_DDP_HELPER.search(last_part(qual)))


def ddp_models(model: Model) -> list[DDPModel]:
    return model.memo("ddp_models", _find_ddp_models)


def _find_ddp_models(model: Model) -> list[DDPModel]:
    found = []
    for scope in model.scopes:
        for defs in scope.defs.values():
            for d in defs:
                if d.op != "=" or d.tuple_index is not None:
                    continue
                call = _ddp_value(model, d.value, scope, 0)
                if call is not None:
                    found.append(DDPModel(d.target, call, scope, d))
    return found


def _ddp_value(model: Model, value, scope: Scope, depth: int) -> cst.Call | None:
    """The DDP call a value evaluates to: `DDP(m)`, `DDP(m) if dist else m`, `wrap(m)` where
    the module's `def wrap` returns a DDP model."""
    calls = constructions(model.graph, value, scope, depth)
    return next((call for call in calls if is_ddp_call(model, call)), None)


def wrapped_on_every_path(model: Model, held: DDPModel) -> bool:
    """Whether the name is a DDP model on every run: not `if ddp: model = DDP(model)` nor
    `DDP(m) if distributed else m`, where a single-process run keeps a plain module (which
    has no `no_sync()`)."""
    d = held.bound
    if isinstance(d.value, cst.IfExp) or any(f.kind == FrameKind.IF for f in d.stmt.frames):
        return False
    later = [x for x in held.scope.defs.get(held.name, ()) if x.stmt.order > d.stmt.order]
    return not later


def ddp_held_by(model: Model, text: str | None, scope: Scope, depth: int = 0) -> DDPModel | None:
    """The DDP model an expression holds at this point of `scope`, or None."""
    if not text or depth > FOLLOW_DEPTH:
        return None
    known = ddp_models(model)
    if text.startswith("self."):
        same = [m for m in known if m.name == text and m.scope.class_name == scope.class_name]
        return same[0] if same else None
    defs = scope.defs.get(text)
    if defs:
        for m in known:
            if any(m.bound is d for d in defs):
                return m
        for d in defs:  # `net = model` or `model = model.to(device)` keep what `model` held
            source = _alias_source(d)
            if source is not None and source != text:
                held = ddp_held_by(model, source, scope, depth + 1)
                if held is not None:
                    return held
        return None
    if text in scope.params:
        # a parameter holds what this module's callers pass; called only from elsewhere, it is
        # not another function's variable of the same name (`def setup(model)`'s `model`)
        sites = model.argument_sites(scope, text)
        for expr, stmt in sites:
            held = ddp_held_by(model, dotted(expr), stmt.scope, depth + 1)
            if held is not None:
                return held
        return None
    if scope.parent is not None:
        return ddp_held_by(model, text, scope.parent, depth)
    return None


def _alias_source(d: Def) -> str | None:
    if d.op != "=" or d.tuple_index is not None:
        return None
    value = d.value
    pair = method_call(value)
    if pair is not None and pair[1] in ("to", "cuda", "train"):
        value = pair[0]
    return dotted(value)


def forward_calls(model: Model, calls: list[CallSite], held: DDPModel | str) -> list[CallSite]:
    """Calls that run a model's forward: `model(x)`, `model.forward(x)`, a call handed the
    model (`compute_loss(model, batch)`), or a call of a module function that does one of
    these (timm's nested `_forward()`). `held` is a DDP model, or the text of a model that is
    not one (`accelerator.no_sync(model)` of a prepared model)."""
    return [c for c in calls if _runs_forward(model, c.call, c.stmt.scope, held, 0)]


def calls_handed(model: Model, calls: list[CallSite], held: DDPModel | str) -> list[CallSite]:
    """Calls given the model as an argument (`criterion(model, batch)`, whatever the callee's
    name): in a `no_sync()` block that holds the backward, such a call may run the forward."""
    return [
        c
        for c in calls
        if any(_is_model(model, dotted(a.value), c.stmt.scope, held) for a in c.call.args)
    ]


def _is_model(model: Model, text: str | None, scope: Scope, held: DDPModel | str) -> bool:
    if isinstance(held, str):
        return text == held
    return ddp_held_by(model, text, scope) is held


def _runs_forward(model: Model, call: cst.Call, scope: Scope, held, depth: int) -> bool:
    func = dotted(call.func)
    if func is not None and func.endswith(".forward"):
        func = func[: -len(".forward")]
    if _is_model(model, func, scope, held):
        return True
    callee = model.local_function(call.func, scope)
    if callee is None:
        # an imported helper handed the model runs its forward when named for it
        # (`compute_loss(model, batch)`), not `unwrap_ddp(model)` or `save(model)`
        handed = any(_is_model(model, dotted(arg.value), scope, held) for arg in call.args)
        return handed and bool(_FORWARD_HELPER.search(last_part(func)))
    if depth >= FOLLOW_DEPTH:
        return False
    return any(_runs_forward(model, c.call, callee, held, depth + 1) for c in callee.calls)


def module_calls(model: Model, held: DDPModel, calls: list[CallSite]) -> list[CallSite]:
    """`<ddp>.module(...)` and `<ddp>.module.forward(...)`: forwards that bypass DDP's hooks."""
    found = []
    for c in calls:
        func = dotted(c.call.func) or ""
        for suffix in (".module", ".module.forward"):
            if func.endswith(suffix):
                owner = func[: -len(suffix)]
                if ddp_held_by(model, owner, c.stmt.scope) is held:
                    found.append(c)
    return found


_NOT_A_MODEL = re.compile(r"loader|(^|_)dl$|data|sched|opt", re.I)


def prepared_models_in(model: Model, loop: TrainingLoop) -> list[tuple[str, cst.CSTNode, CallSite]]:
    """Models returned by `accelerator.prepare(...)` (DDP whenever the script is launched on
    several processes) whose forward the loop runs with gradients on every micro-step: (the
    prepared name, its prepare call, the first such forward call)."""
    calls = [
        c
        for c in loop_calls(model, loop)
        if not _grad_free(model, c.stmt) and not model.on_update_step(loop, c.stmt)
    ]
    found = []
    for name, prepared in model.setup.prepared.items():
        words = (last_part(name), last_part(prepared.original))
        if any(_NOT_A_MODEL.search(w) for w in words) or model.is_optimizer(name):
            continue
        forwards = forward_calls(model, calls, name)
        if forwards:
            found.append((name, prepared.node, forwards[0]))
    return found


def loop_calls(model: Model, loop: TrainingLoop) -> list[CallSite]:
    """The calls in a training loop's own body (its function's statements inside it)."""
    return [c for c in loop.scope.calls if inside(c.stmt, loop.node)]


_GRAD_OFF = {"torch.no_grad", "torch.inference_mode", "torch.set_grad_enabled"}


def _grad_free(model: Model, stmt: Stmt) -> bool:
    """Under `torch.no_grad()` / `inference_mode()` / `set_grad_enabled(...)` (which may be off)."""
    for frame in stmt.frames:
        if frame.kind == FrameKind.WITH:
            for item in frame.node.items:
                func = item.item.func if isinstance(item.item, cst.Call) else None
                if (model.imports.qualify(func) or "") in _GRAD_OFF:
                    return True
    return False


def inside(stmt: Stmt, node: cst.CSTNode) -> bool:
    """In the loop `node`, or anywhere in the function when the function is the owner."""
    return node is stmt.scope.node or any(f.node is node for f in stmt.frames)


def ddp_models_in(model: Model, loop: TrainingLoop) -> list[tuple[DDPModel, CallSite]]:
    """Each DDP model the loop runs forward with gradients on every micro-step (a teacher under
    `no_grad` never all-reduces; a forward only on the update step syncs once), with its first
    such forward call in the loop."""
    calls = [
        c
        for c in loop_calls(model, loop)
        if not _grad_free(model, c.stmt) and not model.on_update_step(loop, c.stmt)
    ]
    found: list[tuple[DDPModel, CallSite]] = []
    for held in ddp_models(model):
        if any(h is held for h, _ in found):
            continue
        forwards = forward_calls(model, calls, held)
        if forwards:
            found.append((held, forwards[0]))
    return found
