"""`DistributedSampler`s, the loaders that use them, the epoch loops that iterate those loaders,
and whether each epoch tells the sampler its epoch."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import (
    dotted,
    is_false,
    keyword,
    last_part,
    method_call,
    positional,
    walk,
)
from linter.model.functions import CallSite, Scope, Stmt
from linter.model.loops import BACKWARD_KINDS, STEP_KINDS
from linter.model.setup import is_prepare

if TYPE_CHECKING:
    from linter.model import Model, TrainingLoop
from linter.model.ddp_models import inside
from linter.model.evaluates import receiving_calls

_LOADER_CALLEE = re.compile(r"loader|sampler|prefetch|tqdm|iter|enumerate", re.I)


@dataclass(eq=False)
class Sampler:
    call: cst.Call
    stmt: Stmt
    name: str | None  # None when built inline as a loader argument
    loaders: list[str] = field(default_factory=list)  # in the order they are built


# samplers -------------------------------------------------------------------------------------
def shuffling_samplers(model: Model) -> list[Sampler]:
    return model.memo("samplers", _find_samplers)


def _find_samplers(model: Model) -> list[Sampler]:
    found = []
    for c in model.calls:
        if last_part(model.imports.qualify(c.call.func)) != "DistributedSampler":
            continue
        if _shuffle_off(c.call):
            continue
        name = _bound_name(c)
        sampler = Sampler(c.call, c.stmt, name)
        sampler.loaders = _loaders_of(model, c, name)
        found.append(sampler)
    return found


def _shuffle_off(call: cst.Call) -> bool:
    shuffle = keyword(call, "shuffle")
    args = positional(call)
    if shuffle is None and len(args) > 3:
        shuffle = args[3]
    return is_false(shuffle)


def _bound_name(c: CallSite) -> str | None:
    """The name a call is assigned to, also as one arm of a conditional (`sampler =
    RandomSampler(ds) if single else DistributedSampler(ds)`)."""
    node = c.stmt.node
    value = getattr(node, "value", None)
    arms = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
    if isinstance(node, (cst.Assign, cst.AnnAssign)) and any(arm is c.call for arm in arms):
        targets = node.targets if isinstance(node, cst.Assign) else [node]
        texts = [dotted(t.target) for t in targets]
        return texts[0] if len(texts) == 1 else None
    return None


def _loaders_of(model: Model, c: CallSite, name: str | None) -> list[str]:
    """The names bound to a call that takes the sampler (a `DataLoader(sampler=...)`, a
    `BatchSampler(sampler, ...)` then its loader, a `build_loader(ds, sampler)` helper, and
    the names bound to calls of a module function that returns such a loader)."""
    loaders: list[str] = []
    holders = {name} if name else set()
    frontier = [c.call]
    for _ in range(3):
        takers = []
        for other in model.calls:
            if other.call is c.call:
                continue
            if _builds_loader(other, frontier, holders):
                takers.append(other)
        frontier = []
        for taker in takers:
            for holder in [taker, *receiving_calls(model.graph, taker)]:
                bound = _bound_name(holder)
                if bound is not None and bound not in holders:
                    holders.add(bound)
                    loaders.append(bound)
                elif bound is None:
                    frontier.append(holder.call)
    return loaders


def _builds_loader(c: CallSite, frontier: list, holders: set[str]) -> bool:
    """A call that builds a loader from the sampler (or from a loader built from it): handed
    as `sampler=` / `batch_sampler=`, or to a callee named for loading or iterating
    (`BatchSampler`, `create_loader`, `tqdm`). `len(loader)` or `train(loader)` give other
    values, not loaders."""
    for arg in c.call.args:
        value = arg.value
        if not any(value is f for f in frontier) and dotted(value) not in holders:
            continue
        if arg.keyword is not None and arg.keyword.value in ("sampler", "batch_sampler"):
            return True
        if _LOADER_CALLEE.search(last_part(c.func)):
            return True
    return False


def prepared_by_engine(model: Model, text: str) -> bool:
    """A loader handed to `accelerator.prepare(...)` (Accelerate sets the epoch itself)."""
    for c in model.calls:
        if is_prepare(c.method, "data_loader"):
            if any(dotted(a.value) == text for a in c.call.args):
                return True
    return text in model.setup.prepared


def trains(model: Model, node: cst.CSTNode, scope: Scope) -> bool:
    """Whether a loop trains: it reaches a backward and a `.step()` (in its body or in module
    functions it calls). Only a training loader's order matters: evaluation, or gradients
    summed for analysis with no update (head importance), visit the samples in any order."""
    kinds = _reached_kinds(model, node, scope, 0)
    return bool(kinds & set(BACKWARD_KINDS)) and "step" in kinds


def _reached_kinds(model: Model, node: cst.CSTNode, scope: Scope, depth: int) -> set[str]:
    kinds = {s.kind for s in model.sites[id(scope)] if inside(s.stmt, node)}
    for c in scope.calls:
        if not inside(c.stmt, node):
            continue
        if c.method == "step":
            kinds.add("step")
        callee = model.local_function(c.call.func, scope) if depth < 2 else None
        if callee is not None:
            kinds |= _reached_kinds(model, callee.node, callee, depth + 1)
    return kinds


def sets_epoch(model: Model, node: cst.CSTNode, scope: Scope, foreign: set[str], depth=0) -> bool:
    """A `.set_epoch(` call in `node` (or in a module function called there) on anything but
    another known sampler or loader (`foreign`)."""
    calls = [(c.call, c.method, c.receiver) for c in scope.calls if inside(c.stmt, node)]
    calls += [_call_parts(call) for call in _header_calls(node)]
    for call, method, receiver in calls:
        if method == "set_epoch" and not _names_foreign(receiver, foreign):
            return True
        callee = model.local_function(call.func, scope) if depth < 2 else None
        if callee is not None and sets_epoch(model, callee.node, callee, foreign, depth + 1):
            return True
    return False


def _header_calls(node: cst.CSTNode):
    """Calls in the headers of loops, `if`s and `with`s nested in `node`: they run once per
    pass of `node` too (`for x, y in start_epoch(loader, epoch):` in the epoch loop), but the
    scope's calls hold only those of small statements."""
    for sub in walk(node):
        if sub is node:
            continue  # the epoch loop's own header runs once, before the first epoch
        if isinstance(sub, cst.For):
            headers = [sub.iter]
        elif isinstance(sub, (cst.While, cst.If)):
            headers = [sub.test]
        elif isinstance(sub, cst.With):
            headers = [item.item for item in sub.items]
        else:
            continue
        for header in headers:
            yield from (n for n in walk(header) if isinstance(n, cst.Call))


def _call_parts(call: cst.Call) -> tuple[cst.Call, str | None, str | None]:
    pair = method_call(call)
    return call, pair[1] if pair else None, dotted(pair[0]) if pair else None


def _names_foreign(receiver: str | None, foreign: set[str]) -> bool:
    if not receiver:
        return False
    head = receiver.removesuffix(".batch_sampler.sampler").removesuffix(".sampler")
    return receiver in foreign or head in foreign


def step_sites(loop: TrainingLoop):
    return loop.of_kind(*STEP_KINDS)


@dataclass(eq=False)
class EpochLoop:
    """A loop that makes repeated passes over a sampled training loader."""

    node: cst.For | cst.While  # the loop right around the pass (reported)
    outer: cst.CSTNode  # the outermost loop around it (where a `set_epoch` may sit)
    scope: Scope
    helper: Scope | None  # the function that iterates the loader, when the loop calls it


def epoch_loops(model: Model, loader: str) -> list[EpochLoop]:
    """The loops around each training pass over `loader`: around `for b in loader:` in the
    same function, or around a call handing the loader to a function that trains on it."""
    found: list[EpochLoop] = []
    for scope in model.scopes:
        for node in scope.loops:
            if isinstance(node, cst.For) and _iterates(model, node.iter, scope, loader):
                if trains(model, node, scope):
                    found.extend(_around(model, node, scope, None))
        for c in scope.calls:
            if _hands_loader_to_training(model, c, loader):
                callee = model.local_function(c.call.func, scope)
                found.extend(_around(model, c.stmt, scope, callee, within=True))
    unique: dict[int, EpochLoop] = {}
    for loop in found:
        unique.setdefault(id(loop.node), loop)
    return list(unique.values())


def _iterates(model: Model, iterable, scope: Scope, loader: str) -> bool:
    for node in walk(iterable):
        text = dotted(node)
        if text is not None and _holds_loader(model, text, scope, loader, 0):
            return True
    return False


def _holds_loader(model: Model, text: str, scope: Scope, loader: str, depth: int) -> bool:
    if text == loader and (text in _visible_names(scope) or text.startswith("self.")):
        return True
    if depth < 2 and text in scope.params:
        return any(
            _holds_loader(model, dotted(e) or "", s.scope, loader, depth + 1)
            for e, s in model.argument_sites(scope, text)
        )
    return False


def _visible_names(scope: Scope) -> set[str]:
    names: set[str] = set()
    while scope is not None:
        names.update(scope.defs)
        scope = scope.parent
    return names


def _hands_loader_to_training(model: Model, c: CallSite, loader: str) -> bool:
    """`train_one_epoch(model, loader, ...)`: a module function that trains on the loader, or
    an imported one named for training (MAE and DINO keep the pass in another file)."""
    if not any(dotted(a.value) == loader for a in c.call.args):
        return False
    callee = model.local_function(c.call.func, c.stmt.scope)
    if callee is not None:
        return False  # its own loop over the parameter is found directly
    return "train" in last_part(c.func).lower()


def _around(
    model: Model, inner, scope: Scope, helper: Scope | None, within: bool = False
) -> list[EpochLoop]:
    """The epoch loop(s) around a pass: enclosing loops in this function, else the loops
    around this function's calls (a `train_one_epoch` called once per epoch)."""
    chain = _enclosing(scope, inner, within)
    if chain:
        return [EpochLoop(chain[-1], chain[0], scope, helper)]
    if not isinstance(scope.node, cst.FunctionDef):
        return []
    found = []
    for call in model.graph.callers(scope):
        loops = call.stmt.loops()
        if loops:
            found.append(EpochLoop(loops[-1], loops[0], call.stmt.scope, scope))
    return found


def _enclosing(scope: Scope, inner, within: bool) -> list[cst.CSTNode]:
    """Loops around a loop node (or around a statement, `within=True`), outermost first."""
    if within:
        return inner.loops()
    for stmt in scope.stmts:
        chain = stmt.loops()
        if inner in chain:
            return chain[: chain.index(inner)]
    return []
