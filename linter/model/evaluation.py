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
from linter.model.functions import CallSite, Scope, Stmt

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
_MAX_DEPTH = 4


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


def _find_contexts(model) -> list[EvalContext]:
    contexts = []
    for scope in model.scopes:
        if _is_eval_function(scope):
            contexts.append(EvalContext("function", scope.node, scope, list(scope.stmts)))
            continue
        for loop in scope.loops:
            if isinstance(loop, cst.For) and is_eval_iterable(loop.iter):
                stmts = [s for s in scope.stmts if any(f.node is loop for f in s.frames)]
                contexts.append(EvalContext("loop", loop, scope, stmts))
        for stmt in scope.stmts:
            if _has_eval_comprehension(stmt.node):
                contexts.append(EvalContext("comprehension", stmt.node, scope, [stmt]))
    for context in contexts:
        ids = {id(s) for s in context.stmts}
        context.model_calls = [
            c for c in context.scope.calls if id(c.stmt) in ids and is_model_call(model, c)
        ]
    return [c for c in contexts if c.model_calls and not _needs_gradients(model, c)]


def _is_eval_function(scope: Scope) -> bool:
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


def _has_eval_comprehension(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.CompFor) and is_eval_iterable(n.iter) for n in walk(node))


def model_names(model) -> set[str]:
    """Last parts of the names that hold models: prepared or DDP-wrapped objects, receivers of
    `.eval()` / `.train()`, and names that say so (`model`, `net`, `ema_model`)."""

    def build(m) -> set[str]:
        names = {last_part(p.name) for p in m.setup.prepared.values()}
        names |= {last_part(n) for n in m.setup.ddp_models}
        for call in m.calls:
            if call.method in ("eval", "train") and call.receiver:
                names.add(last_part(_unwrapped(call.receiver)))
        return names

    return model.memo("evaluation.model_names", build)


def _unwrapped(text: str) -> str:
    parts = text.split(".")
    while len(parts) > 1 and parts[-1] in _WRAPPER_ATTRS:
        parts.pop()
    return ".".join(parts)


def is_model_call(model, call: CallSite) -> bool:
    """`model(x)`, `self.net(x)`, `model.module(x)`: a forward of a name that holds a model.
    Imported callables and the module's own functions and classes (`create_model(...)`,
    `validate_network(...)`) are not models, whatever their name."""
    text = call.func
    if text is None or model.imports.is_imported(call.call.func):
        return False
    if model.defines_function(call.call.func) or text in _class_names(model):
        return False
    name = last_part(_unwrapped(text))
    if name in ("eval", "train") or _FACTORY.match(name):
        return False
    return name in model_names(model) or bool(_MODEL_NAME.match(name))


def _class_names(model) -> set[str]:
    def build(m) -> set[str]:
        return {n.name.value for n in walk(m.module, True) if isinstance(n, cst.ClassDef)}

    return model.memo("evaluation.class_names", build)


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
    if any(_encloses(context, loop.node) for loop in model.loops):
        return True
    return context.kind == "function" and _reaches_training(model, context.scope, 0)


def _reaches_training(model, scope: Scope, depth: int) -> bool:
    """A function that trains through a helper it calls (`eval_linear()` calling `train()`)
    runs a training script, not an evaluation."""
    if depth > _MAX_DEPTH:
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


def _encloses(context: EvalContext, node: cst.CSTNode) -> bool:
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
        if frame.kind == "with" and any(
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
    if depth >= _MAX_DEPTH or not isinstance(scope.node, cst.FunctionDef):
        return False
    callers = callers_of(model, scope)
    return bool(callers) and all(_grad_free(model, c.stmt, depth + 1) for c in callers)


def _expr_stmts(scope: Scope, order: int | None):
    """Top-level expression statements of the function before `order`."""
    for stmt in scope.stmts:
        if order is not None and stmt.order >= order:
            break
        if not stmt.frames and isinstance(stmt.node, cst.Expr):
            yield stmt


def callers_of(model, scope: Scope) -> list[CallSite]:
    table = model.memo("evaluation.callers", _callers_table)
    return table.get(id(scope), [])


def _callers_table(model) -> dict[int, list[CallSite]]:
    table: dict[int, list[CallSite]] = {}
    for call in model.calls:
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is not None:
            table.setdefault(id(callee), []).append(call)
    return table


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


# modes ------------------------------------------------------------------------------------


_MODE_DEPENDENT = re.compile(r"dropout|batch_?norm|from_pretrained", re.I)


def mode_matters(model) -> bool:
    """Whether the file shows layers that behave differently in train mode (dropout,
    BatchNorm, or a pretrained model that has them); a plain conv net computes the same."""
    return model.memo(
        "evaluation.mode_matters", lambda m: bool(_MODE_DEPENDENT.search(m.module.code))
    )


def sets_eval_mode_anywhere(model) -> bool:
    """Any `.eval()` or `.train(<not True>)` in the module: then where the mode is set before an
    evaluation cannot be ruled out statically, so only a module that never sets it is judged."""
    for call in model.calls:
        if call.method == "eval" and not call.call.args:
            return True
        if call.method == "train" and call.call.args and not _is_true(call.call.args[0].value):
            return True
    return False


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
            calls = [c for c in scope.calls if any(f.node is epoch for f in c.stmt.frames)]
            if _may_set_train(model, calls, trained, 0):
                continue
            for eval_call, name in _eval_calls(model, calls, 0):
                if name in trained:
                    leaks.setdefault(id(eval_call.call), ModeLeak(eval_call, epoch, name))
    return list(leaks.values())


def _trained_models(model, loop) -> set[str]:
    """Models the training loop calls with gradients on and that are not frozen."""
    frozen = _frozen_models(model)
    found = set()
    for call in loop.scope.calls:
        in_loop = loop.node is loop.scope.node or any(f.node is loop.node for f in call.stmt.frames)
        if in_loop and is_model_call(model, call) and not grad_free(model, call.stmt):
            name = last_part(_unwrapped(call.func or ""))
            if name not in frozen:
                found.add(name)
    return found


def _frozen_models(model) -> set[str]:
    """`encoder.requires_grad_(False)`: a frozen helper may stay in eval mode for good."""
    frozen = set()
    for call in model.calls:
        if call.method == "requires_grad_" and call.receiver:
            args = positional(call.call)
            if args and isinstance(args[0], cst.Name) and args[0].value == "False":
                frozen.add(last_part(_unwrapped(call.receiver)))
    return frozen


def _epoch_loops(model, loop) -> list[tuple[Scope, cst.CSTNode]]:
    """The loop around the training loop in its own function, else the loops around the calls of
    that function (`for epoch ...: train_one_epoch(...)`)."""
    if loop.node is not loop.scope.node:
        outer = _loop_around(loop.scope, loop.node)
        if outer is not None:
            return [(loop.scope, outer)]
    found = []
    for call in callers_of(model, loop.scope):
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
        if call.method == "train" and (not call.call.args or _is_true(call.call.args[0].value)):
            return True
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is None:
            if _passes_model(call, trained) and call.method not in ("eval", "train"):
                return True
            continue
        if depth < _MAX_DEPTH and _may_set_train(model, callee.calls, trained, depth + 1):
            return True
    return False


def _passes_model(call: CallSite, trained: set[str]) -> bool:
    """`train_one_epoch(model, ...)` or `trainer.fit(model)`: a trained model handed over by
    name (not a forward's output such as `criterion(model(x), y)`)."""
    for arg in call.call.args:
        text = dotted(arg.value)
        if text is not None and last_part(_unwrapped(text)) in trained:
            return True
    return False


def _eval_calls(model, calls: list[CallSite], depth: int, names=None) -> list[tuple]:
    """(the `.eval()` call, the caller's name for its receiver) in `calls` and in the module
    functions they reach: `evaluate(model)` running `net.eval()` switches `model`."""
    found = []
    for call in calls:
        if call.method == "eval" and not call.call.args:
            receiver = last_part(_unwrapped(call.receiver or ""))
            found.append((call, (names or {}).get(receiver, receiver)))
            continue
        callee = model.local_function(call.call.func, call.stmt.scope)
        if callee is not None and depth < _MAX_DEPTH:
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
            name = last_part(_unwrapped(dotted(arg.value)))
            bound[params[index]] = outer.get(name, name)
    for arg in call.call.args:
        if arg.keyword is not None and dotted(arg.value):
            name = last_part(_unwrapped(dotted(arg.value)))
            bound[arg.keyword.value] = outer.get(name, name)
    return bound


# gathers -----------------------------------------------------------------------------------

_METRIC_SINKS = {"add_batch", "add", "update", "compute", "append", "extend"}
_METRIC_FUNCTION = re.compile(r"metric|accuracy|score|f1|bleu|rouge|precision|recall", re.I)
_METRIC_LOADERS = {"evaluate.load", "datasets.load_metric", "load_metric"}


@dataclass(eq=False)
class MetricGather:
    """`accelerator.gather(...)` in evaluation whose result feeds a metric."""

    call: cst.Call
    stmt: Stmt
    engine: str
    sink: str  # what it feeds: "`metric.add_batch(...)`", "`correct +=`"


def metric_gathers(model) -> list[MetricGather]:
    return model.memo("evaluation.metric_gathers", _find_metric_gathers)


def _find_metric_gathers(model) -> list[MetricGather]:
    found = {}
    for context in _gather_contexts(model):
        for stmt in context.stmts:
            for call in _engine_calls(model, stmt, "gather"):
                sink = _metric_sink(model, context, stmt, call.call)
                if sink is not None:
                    found.setdefault(
                        id(call.call), MetricGather(call.call, stmt, call.receiver, sink)
                    )
    return sorted(found.values(), key=lambda g: g.stmt.order)


def _gather_contexts(model) -> list[EvalContext]:
    """Evaluation contexts, with or without a model call of their own (a loop may gather
    predictions computed by a helper)."""

    def build(m) -> list[EvalContext]:
        contexts = []
        for scope in m.scopes:
            if _is_eval_function(scope):
                contexts.append(EvalContext("function", scope.node, scope, list(scope.stmts)))
                continue
            for loop in scope.loops:
                if isinstance(loop, cst.For) and is_eval_iterable(loop.iter):
                    stmts = [s for s in scope.stmts if any(f.node is loop for f in s.frames)]
                    contexts.append(EvalContext("loop", loop, scope, stmts))
        training = [loop for loop in m.loops]
        return [c for c in contexts if not any(_encloses(c, t.node) for t in training)]

    return model.memo("evaluation.gather_contexts", build)


def _engine_calls(model, stmt: Stmt, method: str) -> list[CallSite]:
    return [
        c
        for c in stmt.scope.calls
        if c.stmt is stmt
        and c.method == method
        and (e := model.engine_for(c.receiver, stmt.scope)) is not None
        and e.kind in ("accelerate", "guard", "unknown")
    ]


def _metric_sink(model, context: EvalContext, stmt: Stmt, gather: cst.Call) -> str | None:
    """Where the gathered value goes: a metric call or list in the same statement, or, through
    the names it is assigned to, a later sink of the context (`correct += (p == t).sum()`)."""
    direct = _sink_in(stmt.node, lambda n: any(s is gather for s in walk(n)))
    if direct is not None:
        return direct
    names = _assigned_names(stmt.node)
    if not names:
        return None
    later = [s for s in context.stmts if s.order > stmt.order]
    if any(_truncates(s.node, names) for s in later):
        return None
    return _names_reach_sink(later, names)


def _truncates(node, names: set[str]) -> bool:
    """`preds = preds[: len(dl.dataset) - seen]`: the padded tail is dropped by hand (what
    `gather_for_metrics` does), so the gathered values are right."""
    if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Subscript):
        return False
    sliced = dotted(node.value.value)
    if sliced not in names or not any(isinstance(e.slice, cst.Slice) for e in node.value.slice):
        return False
    return sliced in _assigned_names(node)


def _names_reach_sink(stmts: list[Stmt], names: set[str]) -> str | None:
    """Follow the gathered names through later assignments (`preds = preds.argmax(-1)`) to a
    sink."""
    names = set(names)

    def reads(node) -> bool:
        return any(isinstance(s, cst.Name) and s.value in names for s in walk(node))

    for stmt in stmts:
        sink = _sink_in(stmt.node, reads)
        if sink is not None:
            return sink
        if isinstance(stmt.node, cst.AugAssign) and reads(stmt.node.value):
            return f"`{dotted(stmt.node.target) or 'a running total'} +=`"
        if isinstance(stmt.node, cst.Assign) and reads(stmt.node.value):
            names |= _assigned_names(stmt.node)
    return None


def _sink_in(node: cst.CSTNode, feeds) -> str | None:
    for sub in walk(node):
        if not isinstance(sub, cst.Call):
            continue
        pair = method_call(sub)
        name = pair[1] if pair is not None else last_part(dotted(sub.func))
        is_sink = name in _METRIC_SINKS or bool(_METRIC_FUNCTION.search(name or ""))
        if is_sink and any(feeds(a.value) for a in sub.args):
            return f"`{dotted(sub.func) or name}(...)`"
    return None


def _assigned_names(node: cst.CSTNode) -> set[str]:
    targets = []
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, cst.AnnAssign):
        targets = [node.target]
    return {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}


@dataclass(eq=False)
class UngatheredMetric:
    """A metric updated from one process's predictions over a prepared evaluation loader."""

    call: cst.Call
    stmt: Stmt
    metric: str


def ungathered_metrics(model) -> list[UngatheredMetric]:
    return model.memo("evaluation.ungathered_metrics", _find_ungathered)


def _find_ungathered(model) -> list[UngatheredMetric]:
    metrics = _metric_objects(model)
    found = []
    for context in _gather_contexts(model):
        if context.kind != "loop" or not _iterates_prepared(model, context):
            continue
        if any(_collects(model, s) for s in context.stmts):
            continue
        for call in context.scope.calls:
            in_context = any(call.stmt is s for s in context.stmts)
            if in_context and call.method in ("add_batch", "add") and call.receiver in metrics:
                found.append(UngatheredMetric(call.call, call.stmt, call.receiver))
    return found


def _metric_objects(model) -> set[str]:
    """Names bound to `evaluate.load(...)` / `load_metric(...)` without `num_process`: metrics
    that compute on what this process gives them (torchmetrics objects sync themselves)."""
    found = set()
    for scope in model.scopes:
        for name, defs in scope.defs.items():
            for d in defs:
                value = d.value
                if isinstance(value, cst.Call) and d.op == "=":
                    qual = model.imports.qualify(value.func) or ""
                    keywords = {a.keyword.value for a in value.args if a.keyword is not None}
                    if qual in _METRIC_LOADERS and "num_process" not in keywords:
                        found.add(name)
    return found


def _iterates_prepared(model, context: EvalContext) -> bool:
    loop = context.node
    for sub in walk(loop.iter):
        text = dotted(sub) if isinstance(sub, (cst.Name, cst.Attribute)) else None
        if text is not None and model.is_prepared(text, context.scope):
            return True
    return False


def _collects(model, stmt: Stmt) -> bool:
    """`gather`, `gather_for_metrics`, `reduce`, `pad_across_processes` or a torch.distributed
    collective: the loop already combines processes somewhere."""
    for sub in walk(stmt.node):
        pair = method_call(sub)
        if pair is not None and ("gather" in pair[1] or pair[1] in ("reduce", "all_reduce")):
            return True
        if isinstance(sub, cst.Call) and "gather" in (dotted(sub.func) or ""):
            return True
    return False
