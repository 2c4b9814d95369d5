"""Gather facts: how evaluation results reach a metric across processes.

`accelerator.gather` keeps the samples a prepared loader repeats to pad its last batch;
`gather_for_metrics` drops them. A metric fed from `gather` (directly, through the names it is
assigned to, or through a running total) counts the padding; one fed from nothing gathered sees
only this process's shard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from linter.model.cst_util import dotted, last_part, method_call, walk
from linter.model.evaluation import EvalContext, encloses, is_eval_function, is_eval_iterable
from linter.model.functions import CallSite, Stmt
from linter.model.kinds import EngineKind

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
                if _reduced_at_once(stmt, call.call):
                    continue
                sink = _metric_sink(model, context, stmt, call.call)
                if sink is not None:
                    found.setdefault(
                        id(call.call), MetricGather(call.call, stmt, call.receiver, sink)
                    )
    return sorted(found.values(), key=lambda g: g.stmt.order)


def _reduced_at_once(stmt: Stmt, gather: cst.Call) -> bool:
    """`accelerator.gather(acc1).mean(0)`: per-process summaries averaged on the spot, as
    `reduce` would (`gather_for_metrics` would cut them by the sample count)."""
    for node in walk(stmt.node):
        pair = method_call(node)
        if pair is not None and pair[0] is gather and pair[1] in ("mean", "sum", "max", "min"):
            return True
    return False


def _gather_contexts(model) -> list[EvalContext]:
    """Evaluation contexts, with or without a model call of their own (a loop may gather
    predictions computed by a helper)."""

    def build(m) -> list[EvalContext]:
        contexts = []
        for scope in m.scopes:
            if is_eval_function(scope):
                contexts.append(EvalContext("function", scope.node, scope, list(scope.stmts)))
                continue
            for loop in scope.loops:
                if isinstance(loop, cst.For) and is_eval_iterable(loop.iter):
                    stmts = [s for s in scope.stmts if any(f.node is loop for f in s.frames)]
                    contexts.append(EvalContext("loop", loop, scope, stmts))
        training = [loop for loop in m.loops]
        return [c for c in contexts if not any(encloses(c, t.node) for t in training)]

    return model.memo("evaluation.gather_contexts", build)


def _engine_calls(model, stmt: Stmt, method: str) -> list[CallSite]:
    return [
        c
        for c in stmt.scope.calls
        if c.stmt is stmt
        and c.method == method
        and (e := model.engine_for(c.receiver, stmt.scope)) is not None
        and e.kind in (EngineKind.ACCELERATE, EngineKind.GUARD, EngineKind.UNKNOWN)
    ]


def _metric_sink(model, context: EvalContext, stmt: Stmt, gather: cst.Call) -> str | None:
    """Where the gathered value goes: a metric call or list in the same statement, or, through
    the names it is assigned to and those derived from them, a later sink of the context
    (`correct += (p == t).sum()`)."""
    later = [s for s in context.stmts if s.order > stmt.order]
    rest = [s for s in stmt.scope.stmts if s.order > stmt.order]  # after the loop too
    direct = _sink_in(stmt.node, lambda n: any(s is gather for s in walk(n)))
    if direct is not None:
        collected = _collected_into(stmt.node, gather)
        if collected is not None and _fitted_later(rest, _derived_names(rest, {collected})):
            return None  # the list of gathered batches is cut to the dataset's length later
        return direct
    names = _assigned_names(stmt.node)
    if not names:
        return None
    if _fitted_later(rest, _derived_names(rest, names)):
        return None
    return _names_reach_sink(later, _derived_names(later, names))


def _collected_into(node: cst.CSTNode, gather: cst.Call) -> str | None:
    """`losses.append(accelerator.gather(...))`: the list the gathered batch is added to."""
    for sub in walk(node):
        pair = method_call(sub)
        if pair is None or pair[1] not in ("append", "extend"):
            continue
        if any(g is gather for a in sub.args for g in walk(a.value)):
            name = dotted(pair[0])
            return name if name is not None and "." not in name else None
    return None


def _fitted_later(later: list[Stmt], names: set[str]) -> bool:
    """The padded tail is dropped by hand, as `gather_for_metrics` does: sliced to a length
    (`torch.cat(losses)[: len(eval_dataset)]`) or copied by a helper handed the dataset (the
    question-answering scripts' `create_and_fill_np_array(start_logits, eval_dataset, n)`)."""
    return any(_truncates(s.node, names) or _fitted_to_dataset(s.node, names) for s in later)


def _derived_names(stmts: list[Stmt], names: set[str]) -> set[str]:
    """The gathered names and those assigned from them later (`preds = tok.decode(preds)`)."""
    names = set(names)
    for stmt in stmts:
        if isinstance(stmt.node, cst.Assign) and _reads_any(stmt.node.value, names):
            names |= _assigned_names(stmt.node)
    return names


def _reads_any(node, names: set[str]) -> bool:
    return any(isinstance(s, cst.Name) and s.value in names for s in walk(node))


def _truncates(node, names: set[str]) -> bool:
    """`preds = preds[: len(dl.dataset) - seen]`, `losses = torch.cat(losses)[: len(ds)]`: the
    padded tail is dropped by hand (what `gather_for_metrics` does), so the values are right."""
    if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Subscript):
        return False
    slices = [e.slice for e in node.value.slice if isinstance(e.slice, cst.Slice)]
    if not slices:
        return False
    sliced = dotted(node.value.value)
    if sliced in names and sliced in _assigned_names(node):
        return True
    return _reads_any(node.value.value, names) and any(_a_length(s.upper) for s in slices)


_LENGTH_NAME = re.compile(r"len|num_(samples|examples)|size", re.I)
_DATASET_NAME = re.compile(r"data(set)?$|_set$|examples$|features$", re.I)


def _a_length(node: cst.BaseExpression | None) -> bool:
    """`len(eval_dataset)`, `num_samples`: an upper bound that counts samples."""
    if node is None:
        return False
    for sub in walk(node):
        if isinstance(sub, cst.Call) and dotted(sub.func) == "len":
            return True
        if isinstance(sub, cst.Name) and _LENGTH_NAME.search(sub.value):
            return True
    return False


def _fitted_to_dataset(node: cst.CSTNode, names: set[str]) -> bool:
    """A call, not a metric, handed the gathered values and a dataset (or its length)."""
    for sub in walk(node):
        if not isinstance(sub, cst.Call):
            continue
        pair = method_call(sub)
        callee = pair[1] if pair is not None else last_part(dotted(sub.func))
        if callee in _METRIC_SINKS or _METRIC_FUNCTION.search(callee or ""):
            continue
        values = [a.value for a in sub.args]
        if not any(_reads_any(v, names) for v in values):
            continue
        others = [v for v in values if not _reads_any(v, names)]
        if any(_a_length(v) or _DATASET_NAME.search(last_part(dotted(v) or "")) for v in others):
            return True
    return False


def _names_reach_sink(stmts: list[Stmt], names: set[str]) -> str | None:
    """The first later statement that hands one of the names to a metric or a running total."""
    for stmt in stmts:
        sink = _sink_in(stmt.node, lambda n: _reads_any(n, names))
        if sink is not None:
            return sink
        if isinstance(stmt.node, cst.AugAssign) and _reads_any(stmt.node.value, names):
            return f"`{dotted(stmt.node.target) or 'a running total'} +=`"
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
    """A metric updated from one process's predictions over a prepared evaluation loader: a
    metric object's `add_batch(...)`, or a count of correct predictions (`correct += (preds ==
    labels).sum().item()`) that no collective combines afterwards."""

    node: cst.CSTNode
    stmt: Stmt
    metric: str
    counter: bool = False


def ungathered_metrics(model) -> list[UngatheredMetric]:
    return model.memo("evaluation.ungathered_metrics", _find_ungathered)


def _find_ungathered(model) -> list[UngatheredMetric]:
    metrics = _metric_objects(model)
    found = []
    for context in _gather_contexts(model):
        loops = _prepared_loops(model, context)
        if not loops or any(_collects(model, s) for s in context.stmts):
            continue
        for call in context.scope.calls if context.kind == "loop" else ():
            in_context = any(call.stmt is s for s in context.stmts)
            if in_context and call.method in ("add_batch", "add") and call.receiver in metrics:
                found.append(UngatheredMetric(call.call, call.stmt, call.receiver))
        for stmt in context.stmts:
            name = _correct_count(stmt)
            in_loop = any(f.node is loop for loop in loops for f in stmt.frames)
            if name is not None and in_loop and not _combined_later(model, stmt, name):
                found.append(UngatheredMetric(stmt.node, stmt, name, counter=True))
    return found


def _prepared_loops(model, context: EvalContext) -> list[cst.For]:
    """The loops of the context that iterate a prepared loader (each process gets 1/W)."""
    if context.kind == "loop":
        return [context.node] if _iterates_prepared(model, context.node, context.scope) else []
    loops = [loop for loop in context.scope.loops if isinstance(loop, cst.For)]
    return [loop for loop in loops if _iterates_prepared(model, loop, context.scope)]


def _correct_count(stmt: Stmt) -> str | None:
    """`correct += (preds == labels).sum().item()` / `hits += preds.eq(y).sum()`: the name of
    a running count of matching predictions, else None."""
    node = stmt.node
    if not isinstance(node, cst.AugAssign) or not isinstance(node.operator, cst.AddAssign):
        return None
    if not isinstance(node.target, cst.Name):  # `self.correct +=`: its readers are not followed
        return None
    name = node.target.value
    compares = any(
        (
            isinstance(sub, cst.Comparison)
            and any(isinstance(t.operator, cst.Equal) for t in sub.comparisons)
        )
        or (method_call(sub) or (None, ""))[1] == "eq"
        for sub in walk(node.value)
    )
    summed = any((method_call(sub) or (None, ""))[1] == "sum" for sub in walk(node.value))
    return name if compares and summed else None


def _combined_later(model, stmt: Stmt, name: str) -> bool:
    """Whether the count is combined across processes after the loop (`accelerator.reduce`,
    `gather`, `all_reduce` of it or of a value built from it), here or, when the function
    returns it, in a caller. A function nobody in the module calls may be combined by its
    callers elsewhere: then it counts as combined (no finding rests on what is not seen)."""
    rest = [s for s in stmt.scope.stmts if s.order > stmt.order]
    names = _derived_names(rest, {name})
    if any(_collects(model, s) and _reads_any(s.node, names) for s in rest):
        return True
    returned = [value for value, _ in stmt.scope.returns if _reads_any(value, names)]
    if not returned:
        return False
    callers = model.graph.callers(stmt.scope)
    if not callers:
        return True
    for caller in callers:
        bound = _assigned_names(caller.stmt.node)
        later = [s for s in caller.stmt.scope.stmts if s.order > caller.stmt.order]
        derived = _derived_names(later, bound) if bound else set()
        if any(_collects(model, s) and _reads_any(s.node, derived) for s in later):
            return True
        if _collects(model, caller.stmt):
            return True
    return False


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


def _iterates_prepared(model, loop: cst.For, scope) -> bool:
    """A loop over a prepared loader, or over a parameter every caller hands one."""
    for sub in walk(loop.iter):
        text = dotted(sub) if isinstance(sub, (cst.Name, cst.Attribute)) else None
        if text is not None and model.is_prepared(text, scope):
            return True
        if text in scope.params and model.seen_prepared(text, scope):
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
