"""Evaluation facts: where a module evaluates, whether gradients are off there, which mode its
models are in, and how evaluation results are gathered across processes.

An evaluation context is a function named like `validate` / `evaluate` / `test`, or a loop (or a
comprehension) over a loader named like `val` / `eval` / `valid` / `test`. Lightning's own hooks
(`validation_step`, `test_step`, ...) are not contexts: Lightning runs them under no_grad and in
eval mode itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from linter.model.cst_util import (
    dotted,
    last_part,
    method_call,
    positional,
    walk,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import CallSite, Scope, Stmt
from linter.model.kinds import FrameKind

_EVAL_FUNCTION = re.compile(
    r"^_?(validate|validation|evaluate|evaluation|eval|val|test)$"
    r"|^_?(validate|evaluate|evaluation|eval|val|test)_(one_)?epoch$"
    r"|^_?(validate|evaluate|eval)_\w+$"
    r"|^_?(run|do)_(validation|evaluation|eval|val|test)$"
)
_EVAL_WORDS = {"val", "valid", "validation", "eval", "evaluation", "test", "dev"}
_LOADER_SUFFIX = re.compile(
    r"^(val|valid|validation|eval|evaluation|test)(loader|dataloader|dl|set|data|dataset|ds)s?$"
)
_MODEL_NAME = re.compile(
    r"^(model|net|network|backbone|encoder|decoder|classifier|unet|transformer|student)s?(_\w+)?$"
    r"|\w*_(model|net|network|unet|encoder|decoder)$"
)
# `get_model()`, `build_model(cfg)`, `unwrap_model(m)`: functions that return a model.
_FACTORY = re.compile(
    r"^(get|build|create|load|make|init|setup|prepare|unwrap|wrap|save|export|set)_"
)
_NO_GRAD_WORDS = ("no_grad", "inference_mode")
_GRAD_ON_PURPOSE = {"backward", "grad", "enable_grad", "requires_grad_", "step", "zero_grad"}
_WRAPPER_ATTRS = {"module", "forward", "_orig_mod"}


@dataclass(eq=False)
class EvalContext:
    """One place that evaluates: a function, or a loop / comprehension over an eval loader."""

    kind: str  # "function" | "loop" | "comprehension"
    node: cst.CSTNode
    scope: Scope
    stmts: list[Stmt]  # the statements that run as part of it
    model_calls: list[CallSite] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.kind == "function":
            return f"`{self.scope.name}()`"
        return "this evaluation loop"


def eval_contexts(model) -> list[EvalContext]:
    return model.memo("evaluation.contexts", _find_contexts)


_TORCH_PACKAGES = {"torch", "accelerate", "lightning", "pytorch_lightning", "transformers", "timm"}


def uses_torch(model) -> bool:
    """Whether the file imports PyTorch or a library on top of it: an MXNet, JAX or TensorFlow
    model call records no autograd graph."""
    return any(full.split(".", 1)[0] in _TORCH_PACKAGES for full in model.imports.aliases.values())


def _find_contexts(model) -> list[EvalContext]:
    if not uses_torch(model):
        return []
    contexts = []
    for scope in model.scopes:
        if is_eval_function(scope):
            contexts.append(EvalContext("function", scope.node, scope, list(scope.stmts)))
            continue
        for loop in scope.loops:
            if isinstance(loop, cst.For) and is_eval_iterable(loop.iter):
                stmts = [s for s in scope.stmts if any(f.node is loop for f in s.frames)]
                contexts.append(EvalContext("loop", loop, scope, stmts))
        for stmt in scope.stmts:
            if _has_eval_comprehension(stmt):
                contexts.append(EvalContext("comprehension", stmt.node, scope, [stmt]))
    frozen = frozen_models(model)
    for context in contexts:
        ids = {id(s) for s in context.stmts}
        context.model_calls = [
            c
            for c in context.scope.calls
            if id(c.stmt) in ids
            and is_model_call(model, c)
            and last_part(unwrapped(c.func or "")) not in frozen
        ]
        if context.kind == "function":
            over_data = [c for c in context.model_calls if _over_data(c.stmt)]
            if over_data or not _called_per_batch(model, context.scope):
                context.model_calls = over_data  # a warm-up forward beside the loop is not it
    return [c for c in contexts if c.model_calls and not _needs_gradients(model, c)]


def _over_data(stmt: Stmt) -> bool:
    """A model call repeated over data: in a loop or a comprehension of its function. A
    `test()` that builds a model and runs one random batch through it is a smoke test."""
    return bool(stmt.loops()) or bool(stmt.comprehensions)


def _called_per_batch(model, scope: Scope) -> bool:
    """An `evaluate(model, batch)` step that the module calls from inside a loop."""
    return any(call.stmt.loops() for call in model.graph.callers(scope))


def is_eval_function(scope: Scope) -> bool:
    return isinstance(scope.node, cst.FunctionDef) and bool(_EVAL_FUNCTION.match(scope.name))


def is_eval_iterable(node: cst.BaseExpression) -> bool:
    """`val_loader`, `tqdm(eval_dataloader)`, `enumerate(self.test_dl)`: a name in the iterable
    that says evaluation. `range(...)` loops (`range(eval_iters)`) count steps, not batches."""
    if isinstance(node, cst.Call) and dotted(node.func) == "range":
        return False
    for sub in walk(node):
        if isinstance(sub, (cst.Name, cst.Attribute)) and is_eval_name(last_part(dotted(sub))):
            return True
    return False


def is_eval_name(name: str) -> bool:
    lowered = name.lower()
    if _LOADER_SUFFIX.match(lowered):
        return True
    return any(part in _EVAL_WORDS for part in lowered.split("_"))


def _has_eval_comprehension(stmt: Stmt) -> bool:
    return any(is_eval_iterable(clause.iter) for clause in stmt.comprehensions)


def model_names(model) -> set[str]:
    """Last parts of the names that hold models: prepared or DDP-wrapped objects, receivers of
    `.eval()` / `.train()`, and names that say so (`model`, `net`, `ema_model`)."""

    def build(m) -> set[str]:
        names = {last_part(p.name) for p in m.setup.prepared.values()}
        names |= {last_part(n) for n in m.setup.ddp_models}
        for call in m.calls:
            if call.method in ("eval", "train") and call.receiver:
                names.add(last_part(unwrapped(call.receiver)))
        return names

    return model.memo("evaluation.model_names", build)


def unwrapped(text: str) -> str:
    parts = text.split(".")
    while len(parts) > 1 and parts[-1] in _WRAPPER_ATTRS:
        parts.pop()
    return ".".join(parts)


def is_model_call(model, call: CallSite) -> bool:
    """`model(x)`, `self.net(x)`, `model.module(x)`: a forward of a name that holds a model.
    Imported callables and the module's own functions and classes (`create_model(...)`,
    `validate_network(...)`) are not models, whatever their name."""
    text = call.func
    if text is None or text.startswith("cls.") or model.imports.is_imported(call.call.func):
        return False  # `cls.extract_from_model(...)` is a class method
    if model.defines_function(call.call.func) or text in model.class_names:
        return False
    name = last_part(unwrapped(text))
    if name in ("eval", "train") or _FACTORY.match(name):
        return False
    return name in model_names(model) or bool(_MODEL_NAME.match(name))


def names_a_model(model, text: str) -> bool:
    """Whether a dotted name holds a model, by what the module does with it or by its name."""
    name = last_part(unwrapped(text))
    return name in model_names(model) or bool(_MODEL_NAME.match(name))


def _needs_gradients(model, context: EvalContext) -> bool:
    """Evaluation that needs gradients on purpose (test-time adaptation, saliency maps): a
    backward, `autograd.grad`, `torch.enable_grad()` or an optimizer step inside it. A loop
    that trains is not evaluation either."""
    for stmt in context.stmts:
        for sub in walk(stmt.node):
            pair = method_call(sub)
            if pair is not None and pair[1] in _GRAD_ON_PURPOSE:
                if pair[1] != "step" or model.is_optimizer(dotted(pair[0])):
                    return True
            if isinstance(sub, cst.Call) and last_part(dotted(sub.func)) == "enable_grad":
                return True
    if any(encloses(context, loop.node) for loop in model.loops):
        return True
    return context.kind == "function" and _reaches_training(model, context.scope, 0)


def _reaches_training(model, scope: Scope, depth: int) -> bool:
    """A function that trains through a helper it calls (`eval_linear()` calling `train()`)
    runs a training script, not an evaluation."""
    if depth > FOLLOW_DEPTH:
        return False
    for call in scope.calls:
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is None or callee is scope:
            continue
        if any(loop.scope is callee for loop in model.loops):
            return True
        if _reaches_training(model, callee, depth + 1):
            return True
    return False


def encloses(context: EvalContext, node: cst.CSTNode) -> bool:
    if context.kind == "function":
        return any(loop is node for loop in context.scope.loops)
    return node is context.node


# gradients -------------------------------------------------------------------------------


def grad_free(model, stmt: Stmt) -> bool:
    """Whether `stmt` runs with gradients off: inside `with torch.no_grad()` /
    `inference_mode()` / `set_grad_enabled(...)` (also `with torch.no_grad(), autocast():`), in a
    function decorated so, after `torch.set_grad_enabled(False)` in its function, or in a function
    that every caller in the module calls with gradients off."""
    return _grad_free(model, stmt, 0)


def _grad_free(model, stmt: Stmt, depth: int) -> bool:
    for frame in stmt.frames:
        if frame.kind == FrameKind.WITH and any(
            _disables_grad(model, i.item, stmt.scope) for i in frame.node.items
        ):
            return True
    return _scope_grad_free(model, stmt.scope, stmt.order, depth)


def _scope_grad_free(model, scope: Scope, order: int | None, depth: int) -> bool:
    if any(_disables_grad(model, s.node.value, scope) for s in _expr_stmts(scope, order)):
        return True
    current = scope
    while current is not None and isinstance(current.node, cst.FunctionDef):
        if any(_is_no_grad_decorator(d.decorator) for d in current.node.decorators):
            return True
        current = current.parent
    if depth >= FOLLOW_DEPTH or not isinstance(scope.node, cst.FunctionDef):
        return False
    callers = model.graph.callers(scope)
    return bool(callers) and all(_grad_free(model, c.stmt, depth + 1) for c in callers)


def _expr_stmts(scope: Scope, order: int | None):
    """Top-level expression statements of the function before `order`."""
    for stmt in scope.stmts:
        if order is not None and stmt.order >= order:
            break
        if not stmt.frames and isinstance(stmt.node, cst.Expr):
            yield stmt


def _disables_grad(model, node, scope: Scope) -> bool:
    if not isinstance(node, cst.Call):
        text = dotted(node)
        defs = scope.defs.get(text or "") or model.module_defs(text or "")
        return len(defs) == 1 and defs[0].op == "=" and _disables_grad_call(model, defs[0].value)
    return _disables_grad_call(model, node)


def _disables_grad_call(model, node) -> bool:
    """`torch.no_grad()`, `torch.inference_mode()`, a project's `smart_inference_mode()`, or
    `torch.set_grad_enabled(x)` with anything but a literal True (`phase == "train"` turns
    gradients off on purpose for evaluation)."""
    if not isinstance(node, cst.Call):
        return False
    name = last_part(model.imports.qualify(node.func) or "")
    if any(word in name for word in _NO_GRAD_WORDS):
        return True
    if name == "set_grad_enabled":
        args = positional(node)
        return bool(args) and not (isinstance(args[0], cst.Name) and args[0].value == "True")
    return False


def _is_no_grad_decorator(node) -> bool:
    target = node.func if isinstance(node, cst.Call) else node
    name = last_part(dotted(target))
    return any(word in name for word in _NO_GRAD_WORDS)


def frozen_models(model) -> set[str]:
    """`encoder.requires_grad_(False)`: a frozen helper may stay in eval mode for good."""
    frozen = set()
    for call in model.calls:
        if call.method == "requires_grad_" and call.receiver:
            args = positional(call.call)
            if args and isinstance(args[0], cst.Name) and args[0].value == "False":
                frozen.add(last_part(unwrapped(call.receiver)))
    return frozen


# --show-loops -------------------------------------------------------------------------------


def describe(model) -> list[dict]:
    """The evaluation contexts found and whether each runs without gradients (`describe` adds
    the gathers and the eval modes never undone: those modules build on this one)."""
    entries = []
    for context in eval_contexts(model):
        first = context.model_calls[0]
        entries.append(
            {
                "kind": f"evaluation {context.kind}",
                "function": context.scope.name,
                "line": model.line(context.node),
                "model_calls": sorted({c.func for c in context.model_calls if c.func}),
                "gradients": "off" if grad_free(model, first.stmt) else "on",
            }
        )
    return entries
