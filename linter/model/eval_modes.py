"""Mode facts: which models evaluation runs in train mode, and epoch loops that switch a trained
model to eval mode without switching it back before the next training step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from linter.model.cst_util import dotted, is_false, last_part, walk
from linter.model.depths import FOLLOW_DEPTH
from linter.model.evaluation import (
    frozen_models,
    grad_free,
    is_model_call,
    unwrapped,
)
from linter.model.functions import CallSite, Scope

_MODE_DEPENDENT = re.compile(r"dropout|batch_?norm", re.I)


def mode_matters(model) -> bool:
    """Whether the file shows layers that behave differently in train mode (dropout or
    BatchNorm; a plain conv net computes the same in both), or trains a `from_pretrained` model
    (which loads in eval mode, so only a `.train()` call makes its evaluation run in train
    mode)."""

    def build(m) -> bool:
        text = m.module.code
        if _MODE_DEPENDENT.search(text):
            return True
        return "from_pretrained" in text and any(c.method == "train" for c in m.calls)

    return model.memo("evaluation.mode_matters", build)


def sets_eval_mode_anywhere(model) -> bool:
    """Any `.eval()` or `.train(<not True>)` in the module: then where the mode is set before an
    evaluation cannot be ruled out statically, so only a module that never sets it is judged."""
    for call in model.calls:
        if call.method == "eval" and not call.call.args:
            return True
        if call.method == "train" and call.call.args and not _is_true(call.call.args[0].value):
            return True
    return False


def loaded_in_eval_mode(model, call: CallSite) -> bool:
    """The called model comes from `from_pretrained(...)` (which returns it in eval mode) and
    nothing in the file calls its `.train()`: a frozen text encoder, not a module in train mode."""
    name = call.func
    if not name or "." in name:
        return False
    defs = list(call.stmt.scope.defs.get(name, ())) or list(model.module_defs(name))
    loaded = bool(defs) and all(
        d.value is not None
        and any(
            isinstance(n, cst.Attribute) and n.attr.value == "from_pretrained"
            for n in walk(d.value)
        )
        for d in defs
    )
    return loaded and not any(c.method == "train" and c.receiver == name for c in model.calls)


def _is_true(node) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def imports_lightning(model) -> bool:
    return any(
        full.split(".", 1)[0] in ("lightning", "pytorch_lightning")
        for full in model.imports.aliases.values()
    )


@dataclass(eq=False)
class ModeLeak:
    """`.eval()` run once per epoch with nothing putting the trained model back in train mode."""

    eval_call: CallSite  # the `.eval()` (possibly inside a function the epoch loop calls)
    epoch_loop: cst.CSTNode
    model_name: str


def eval_mode_leaks(model) -> list[ModeLeak]:
    return model.memo("evaluation.mode_leaks", _find_mode_leaks)


def _find_mode_leaks(model) -> list[ModeLeak]:
    leaks = {}
    for loop in model.loops:
        trained = _trained_models(model, loop)
        for scope, epoch in _epoch_loops(model, loop):
            if scope is not loop.scope and _sets_mode(loop.scope):
                continue  # the per-epoch training function picks its own mode (frozen BN too)
            calls = [c for c in scope.calls if any(f.node is epoch for f in c.stmt.frames)]
            if _may_set_train(model, calls, trained, 0):
                continue
            for eval_call, name in _eval_calls(model, calls, 0):
                if name in trained:
                    leaks.setdefault(id(eval_call.call), ModeLeak(eval_call, epoch, name))
    return list(leaks.values())


def _sets_mode(scope: Scope) -> bool:
    """`model.eval()` / `model.train()` / `model.train_custom()` in the function that trains: a
    linear probe keeps a frozen backbone in eval mode on purpose, each epoch."""
    return any((c.method or "").startswith("train") or c.method == "eval" for c in scope.calls)


def _trained_models(model, loop) -> set[str]:
    """Models the training loop calls with gradients on and that are not frozen."""
    frozen = frozen_models(model)
    found = set()
    for call in loop.scope.calls:
        in_loop = loop.node is loop.scope.node or any(f.node is loop.node for f in call.stmt.frames)
        if in_loop and is_model_call(model, call) and not grad_free(model, call.stmt):
            name = last_part(unwrapped(call.func or ""))
            if name not in frozen:
                found.add(name)
    return found


def _epoch_loops(model, loop) -> list[tuple[Scope, cst.CSTNode]]:
    """The loop around the training loop in its own function, else the loops around the calls of
    that function (`for epoch ...: train_one_epoch(...)`)."""
    if loop.node is not loop.scope.node:
        outer = _loop_around(loop.scope, loop.node)
        if outer is not None:
            return [(loop.scope, outer)]
    found = []
    for call in model.graph.callers(loop.scope):
        loops = call.stmt.loops()
        if loops:
            found.append((call.stmt.scope, loops[-1]))
    return found


def _loop_around(scope: Scope, node: cst.CSTNode) -> cst.CSTNode | None:
    for stmt in scope.stmts:
        loops = stmt.loops()
        if node in loops:
            index = loops.index(node)
            return loops[index - 1] if index > 0 else None
    return None


def _may_set_train(model, calls: list[CallSite], trained: set[str], depth: int) -> bool:
    """A `.train()` in the epoch loop or in a module function it calls; or a call of a function
    defined elsewhere that is handed a trained model (an imported `train_one_epoch(model, ...)`
    may switch it back)."""
    for call in calls:
        method = call.method or ""
        if method.startswith("train") and not (
            call.call.args and is_false(call.call.args[0].value)
        ):
            return True  # `.train()`, `.train(True)`, or `.train(mode)` that may switch back
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is None:
            if _passes_model(call, trained) and call.method not in ("eval", "train"):
                return True
            continue
        if depth < FOLLOW_DEPTH and _may_set_train(model, callee.calls, trained, depth + 1):
            return True
    return False


def _passes_model(call: CallSite, trained: set[str]) -> bool:
    """`train_one_epoch(model, ...)` or `trainer.fit(model)`: a trained model handed over by
    name (not a forward's output such as `criterion(model(x), y)`)."""
    for arg in call.call.args:
        text = dotted(arg.value)
        if text is not None and last_part(unwrapped(text)) in trained:
            return True
    return False


def _eval_calls(model, calls: list[CallSite], depth: int, names=None) -> list[tuple]:
    """(the `.eval()` call, the caller's name for its receiver) in `calls` and in the module
    functions they reach: `evaluate(model)` running `net.eval()` switches `model`."""
    found = []
    for call in calls:
        if call.method == "eval" and not call.call.args:
            receiver = last_part(unwrapped(call.receiver or ""))
            found.append((call, (names or {}).get(receiver, receiver)))
            continue
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is not None and depth < FOLLOW_DEPTH:
            bound = _bound_names(callee, call, names or {})
            found.extend(_eval_calls(model, callee.calls, depth + 1, bound))
    return found


def _bound_names(callee: Scope, call: CallSite, outer: dict) -> dict:
    """The callee's parameter names mapped to the model names the call passes for them."""
    params = list(callee.params)
    if callee.class_name is not None and params and params[0] in ("self", "cls"):
        params = params[1:]
    bound = {}
    for index, arg in enumerate(a for a in call.call.args if a.keyword is None and not a.star):
        if index < len(params) and dotted(arg.value):
            name = last_part(unwrapped(dotted(arg.value)))
            bound[params[index]] = outer.get(name, name)
    for arg in call.call.args:
        if arg.keyword is not None and dotted(arg.value):
            name = last_part(unwrapped(dotted(arg.value)))
            bound[arg.keyword.value] = outer.get(name, name)
    return bound
