"""Training loops: the loop that owns each backward, its step branch, and the value K.

A training loop is the innermost loop around a backward that also holds an optimizer or scaler
step (nanoGPT's `for micro_step in range(K)` sits inside it as a micro-step loop), or the
innermost loop around the backward when no step is visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from linter.model.cst_util import code, dotted, int_value, positional, walk
from linter.model.functions import Def, Frame, Scope, Stmt
from linter.model.kinds import FrameKind, GateKind, RegionKind, SiteKind

if TYPE_CHECKING:
    from linter.model.classes import Classes

STEP_KINDS = (SiteKind.OPT_STEP, SiteKind.SCALER_STEP)
BACKWARD_KINDS = (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD)


@dataclass(eq=False)
class Site:
    """A call the rules care about, e.g. kind "backward" for `loss.backward()`."""

    kind: SiteKind
    call: cst.Call | None
    stmt: Stmt
    receiver: str | None = None
    node: cst.CSTNode | None = None  # the reported node when it is not a call (`p.grad /= N`)
    # a loss scaler's call standing for its `__call__`'s backward: the loss it is handed and
    # the scaler that scales it (`loss_scaler(loss, optimizer)`; see `classes.InstanceCall`)
    loss: cst.BaseExpression | None = None
    scaler: str | None = None


@dataclass(eq=False)
class Gate:
    """What makes a statement run only on the update step.

    kind: "modulo" (`(i + 1) % K == 0`), "counter" (`if micro == K:`), "sync"
    (`accelerator.sync_gradients`), "micro-loop" (`for _ in range(K)` around the backward),
    "accumulate" (`with accelerator.accumulate(model):`); see `kinds.GateKind`.
    """

    kind: GateKind
    k: cst.BaseExpression | None
    node: cst.CSTNode  # the If, the early-exit If, or the micro-step loop
    test: cst.BaseExpression | None = None
    holds: bool = True  # False for an early exit: the update step is where `test` fails
    caller: Scope | None = None  # set when the gate is in a loop that calls this function


@dataclass(eq=False)
class Region:
    kind: RegionKind
    with_node: cst.With
    item: cst.WithItem
    call: cst.Call
    receiver: str | None
    frames: tuple[Frame, ...]
    via_name: bool = False  # `with ctx:` where `ctx` was bound to the call elsewhere


@dataclass(eq=False)
class TrainingLoop:
    node: cst.For | cst.While
    scope: Scope
    sites: list[Site] = field(default_factory=list)
    micro_loop: cst.CSTNode | None = None
    gate: Gate | None = None
    counters: set[str] = field(default_factory=set)
    flags: dict[str, cst.BaseExpression] = field(default_factory=dict)
    # calls, in the loop, of a function of the module that runs the backward and leaves the
    # step to the loop (`self.backward(loss)` in a trainer's `train_step`)
    delegated: list[Stmt] = field(default_factory=list)

    def of_kind(self, *kinds: SiteKind) -> list[Site]:
        return [s for s in self.sites if s.kind in kinds]

    @property
    def backwards(self) -> list[Site]:
        return self.of_kind(*BACKWARD_KINDS)

    @property
    def steps(self) -> list[Site]:
        return self.of_kind(*STEP_KINDS)

    def frames_of(self, stmt: Stmt) -> tuple[Frame, ...]:
        return stmt.frames_inside(self.node)


def find_training_loops(
    scope: Scope,
    sites: list[Site],
    called_in_loop: bool = False,
    classes: Classes | None = None,
    delegated: list[Stmt] | None = None,
) -> list[TrainingLoop]:
    """The training loops of one scope.

    A function with no loop of its own whose body is one micro-step (`def training_step(...)`)
    counts as a loop body when the module calls it from inside a loop (`called_in_loop`); so
    does one that steps and leaves the backward to a function it calls (`delegated`: the calls
    of it, a trainer's `train_step` calling `self.backward(loss)`, then `self.optimizer_step()`).
    """
    loops: dict[int, TrainingLoop] = {}
    for site in sites:
        if site.kind not in BACKWARD_KINDS:
            continue
        chain = site.stmt.loops()
        if not chain and not (called_in_loop and isinstance(scope.node, cst.FunctionDef)):
            continue
        owner = _owner(chain, sites) if chain else scope.node
        loop = loops.get(id(owner))
        if loop is None:
            loop = loops[id(owner)] = TrainingLoop(owner, scope)
            loop.sites = [s for s in sites if _inside(s.stmt, owner)]
            loop.counters = _counters(scope, owner, classes)
            loop.flags = _flags(scope)
        if not chain:
            continue
        index = chain.index(owner)
        if index + 1 < len(chain) and loop.micro_loop is None:
            loop.micro_loop = chain[index + 1]
    if not loops and called_in_loop and delegated and isinstance(scope.node, cst.FunctionDef):
        if any(s.kind in STEP_KINDS for s in sites):  # `train_step`: self.backward(loss), ...
            loop = loops[id(scope.node)] = TrainingLoop(scope.node, scope, list(sites))
            loop.counters = _counters(scope, scope.node, classes)
            loop.flags = _flags(scope)
            loop.delegated = list(delegated)
    for loop in loops.values():
        loop.gate = _step_gate(loop)
    return sorted(loops.values(), key=lambda lp: _first_order(lp))


def delegating_loops(scope: Scope, sites, classes, delegated: list[Stmt]) -> list[TrainingLoop]:
    """The loops of a scope with no training loop of its own whose backward runs in a function
    of the module they call (`backward_step(scaler, loss)`: a step split over module
    functions). Such a loop is still where the window runs (its zero_grad, its gate); the
    backward itself is judged in the function, with this loop's gate, so it holds none."""
    loops: dict[int, TrainingLoop] = {}
    for call in delegated:
        chain = call.loops()
        if not chain or id(chain[-1]) in loops:
            continue
        owner = chain[-1]
        loop = loops[id(owner)] = TrainingLoop(owner, scope)
        loop.sites = [s for s in sites if _inside(s.stmt, owner)]
        loop.counters = _counters(scope, owner, classes)
        loop.flags = _flags(scope)
        loop.gate = _step_gate(loop)
    return list(loops.values())


def _first_order(loop: TrainingLoop) -> int:
    return min((s.stmt.order for s in loop.sites), default=0)


def _owner(chain: list[cst.CSTNode], sites: list[Site]) -> cst.CSTNode:
    for candidate in reversed(chain):
        for s in sites:
            loops = s.stmt.loops()
            if s.kind in STEP_KINDS and loops and loops[-1] is candidate:
                return candidate
    return chain[-1]


def _inside(stmt: Stmt, owner: cst.CSTNode) -> bool:
    """In the loop `owner`, or anywhere in the function when the function is the owner."""
    return owner is stmt.scope.node or any(f.node is owner for f in stmt.frames)


def _counters(scope: Scope, loop: cst.CSTNode, classes: Classes | None = None) -> set[str]:
    """Micro-step counters of the loop, as the text a step gate compares with K.

    `micro` for `micro += 1` in the loop or in a loop around it (neural_sp counts batches in the
    outer loop and steps inside a per-task loop), and `ni - last` for a "last step" marker that
    the loop sets with `last = ni` (YOLO's `ni - last_opt_step >= accumulate`). A trainer's
    `self.micro_step` may be reset by another method (`optimizer_step`) than the one counting.
    """
    around = [loop, *_enclosing_loops(scope, loop)]
    found = set()
    for name, defs in scope.defs.items():
        defs = [d for d in defs if any(_inside(d.stmt, node) for node in around)]
        defs += _reset_elsewhere(scope, name, classes)
        if _is_reset_counter(defs):
            found.add(name)
        for d in defs:
            if d.op == "=" and d.tuple_index is None and dotted(d.value) is not None:
                if _inside(d.stmt, loop):
                    found.add(f"{dotted(d.value)} - {name}")
    return found


def _reset_elsewhere(scope: Scope, name: str, classes: Classes | None) -> list[Def]:
    """Assignments to the attribute `name` in the other methods of `scope`'s class, but its
    `__init__` (which sets where the count starts, as a name's `n = 0` before the loop does)."""
    if classes is None:
        return []
    return [d for d in classes.attribute_defs(scope, name) if d.stmt.scope.name != "__init__"]


def _is_reset_counter(defs) -> bool:
    """`n += 1` plus a reset (`n = 0`, `n -= K`): a window counter, not a global step count
    (`if global_step >= warmup:` gates on progress, not on a window)."""
    counts = any(d.op == "+=" and int_value(d.value) == 1 for d in defs)
    resets = any((d.op == "=" and int_value(d.value) is not None) or d.op == "-=" for d in defs)
    return counts and resets


def _flags(scope: Scope) -> dict[str, cst.BaseExpression]:
    """Names bound once to a condition (`is_accumulating = it % K != 0`, `sync =
    accelerator.sync_gradients`), so that `if not is_accumulating:` reads as the condition."""
    found = {}
    for name, defs in scope.defs.items():
        if len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
            if _is_condition(defs[0].value):
                found[name] = defs[0].value
    return found


def _is_condition(value: cst.BaseExpression | None) -> bool:
    if isinstance(value, (cst.Comparison, cst.UnaryOperation, cst.BooleanOperation)):
        return True
    return isinstance(value, cst.Attribute) and value.attr.value == "sync_gradients"


def _enclosing_loops(scope: Scope, loop: cst.CSTNode) -> list[cst.CSTNode]:
    for stmt in scope.stmts:
        chain = stmt.loops()
        if loop in chain:
            return chain[: chain.index(loop)]
    return []


def caller_gate(
    call: Stmt, steps: list[Stmt], per_batch: bool = False, classes: Classes | None = None
) -> Gate | None:
    """The gate of a loop that calls a step function every iteration (`call`) and steps the
    optimizer only under a condition (`steps`: `if (i + 1) % K == 0: self.optimizer_step()`).
    `per_batch`: the calling function runs every batch itself (a trainer's `train_step` calls
    `self.backward(loss)`, then `self.optimizer_step()` under the gate), so its body is the
    iteration."""
    loops = call.loops()
    if not loops and not per_batch:
        return None
    node = loops[-1] if loops else call.scope.node
    counters, flags = _counters(call.scope, node, classes), _flags(call.scope)
    if any(update_gate(f, counters, flags) for f in call.frames_inside(node)):
        return None  # the function itself runs only on update steps
    for step in steps:
        if step.scope is not call.scope or not _inside(step, node):
            continue
        for frame in reversed(step.frames_inside(node)):
            gate = update_gate(frame, counters, flags)
            if gate is not None:
                gate.caller = call.scope
                return gate
    return None


def step_gate(loop: TrainingLoop, step: Site) -> Gate | None:
    """The condition that lets this optimizer/scaler step run only on update steps."""
    for frame in reversed(loop.frames_of(step.stmt)):
        gate = update_gate(frame, loop.counters, loop.flags)
        if gate is not None:
            return gate
    return None


def same_path(a: Stmt, b: Stmt) -> bool:
    """Whether both statements can run in one iteration (no `if` puts them in opposite branches)."""
    branches = {id(f.node): f.holds for f in a.frames if f.kind == FrameKind.IF}
    return all(
        branches.get(id(f.node), f.holds) == f.holds for f in b.frames if f.kind == FrameKind.IF
    )


def _step_gate(loop: TrainingLoop) -> Gate | None:
    for step in loop.steps:
        gate = step_gate(loop, step)
        if gate is not None:
            return gate
    zeroed = any(
        any(f.node is loop.micro_loop for f in z.stmt.frames)
        for z in loop.of_kind(SiteKind.ZERO_GRAD)
    )
    if loop.micro_loop is not None and not zeroed:
        node = loop.micro_loop
        k = _micro_count(node.iter) if isinstance(node, cst.For) else None
        return Gate(GateKind.MICRO_LOOP, k, node)
    return None


def _micro_count(iterable: cst.BaseExpression) -> cst.BaseExpression | None:
    """K of `range(K)`, `batch.chunk(K)` or `torch.chunk(batch, K)` (also under `enumerate` or
    as the first of a `zip`)."""
    if not isinstance(iterable, cst.Call):
        return None
    args = positional(iterable)
    name = dotted(iterable.func) or ""
    if name in ("enumerate", "zip") and args:
        return _micro_count(args[0])
    if name == "range" and len(args) == 1:
        return args[0]
    if name.rsplit(".", 1)[-1] == "chunk" and args:
        return args[0] if name != "torch.chunk" else (args[1] if len(args) > 1 else None)
    if isinstance(iterable.func, cst.Attribute) and iterable.func.attr.value == "chunk" and args:
        return args[0]
    return None


def inline_gate(
    stmt: Stmt, node: cst.CSTNode, counters: set[str], flags=None, accept=None
) -> Gate | None:
    """The gate of a conditional expression around `node` inside its statement: the clip in
    `clip(...) if accelerator.sync_gradients else None` or `accelerator.sync_gradients and
    clip(...)` runs only on update steps."""
    for test, holds, guarded in _conditional_parts(stmt.node):
        if any(sub is node for sub in walk(guarded)):
            found = _classify(test, holds, counters, flags or {}, accept)
            if found is not None:
                return Gate(found[0], found[1], stmt.node, test, holds)
    return None


def _conditional_parts(root: cst.CSTNode):
    """(test, truth value, guarded expression) of every conditional expression in `root`."""
    for sub in walk(root):
        if isinstance(sub, cst.IfExp):
            yield sub.test, True, sub.body
            yield sub.test, False, sub.orelse
        elif isinstance(sub, cst.BooleanOperation):
            yield sub.left, isinstance(sub.operator, cst.And), sub.right


def update_gate(frame: Frame, counters: set[str], flags=None, accept=None) -> Gate | None:
    """The gate when `frame` lets only update steps through, else None. `accept(kind, K)` may
    turn down a condition (a logging cadence), so that the other side of `and` is tried."""
    if frame.kind not in (FrameKind.IF, FrameKind.EXIT):
        return None
    found = _classify(frame.test, frame.holds, counters, flags or {}, accept)
    if found is None:
        return None
    kind, k = found
    return Gate(kind, k, frame.node, frame.test, frame.holds)


def _classify(test, holds: bool, counters: set[str], flags: dict, accept=None):
    """(kind, K) when `test` having truth value `holds` means "this is an update step"."""
    name = dotted(test)
    if name in flags:
        rest = {k: v for k, v in flags.items() if k != name}
        return _classify(flags[name], holds, counters, rest, accept)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _classify(test.expression, not holds, counters, flags, accept)
    if isinstance(test, cst.BooleanOperation):
        # Compound gates (`(i + 1) % K == 0 or i + 1 == len(dl)`) gate on either side.
        return _classify(test.left, holds, counters, flags, accept) or _classify(
            test.right, holds, counters, flags, accept
        )
    found = _simple_gate(test, holds, counters)
    if found is not None and accept is not None and not accept(*found):
        return None
    return found


def _simple_gate(test, holds: bool, counters: set[str]):
    if isinstance(test, cst.Attribute) and test.attr.value == "sync_gradients":
        return (GateKind.SYNC, None) if holds else None
    if isinstance(test, cst.BinaryOperation) and isinstance(test.operator, cst.Modulo):
        return _modulo(test, not holds)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        return _comparison(test, holds, counters)
    return None


def _modulo(node: cst.BinaryOperation, is_update: bool):
    k = node.right
    value = int_value(k)
    if value is not None and value <= 1:
        return None
    return (GateKind.MODULO, k) if is_update else None


def _find_modulo(node: cst.CSTNode) -> cst.BinaryOperation | None:
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Modulo):
            return node
        return _find_modulo(node.left) or _find_modulo(node.right)
    return None


def _comparison(test: cst.Comparison, holds: bool, counters: set[str]):
    target = test.comparisons[0]
    operator = target.operator
    equal = isinstance(operator, cst.Equal)
    not_equal = isinstance(operator, cst.NotEqual)
    modulo = _find_modulo(test.left) or _find_modulo(target.comparator)
    if modulo is not None and (equal or not_equal):
        return _modulo(modulo, holds if equal else not holds)
    left = dotted(test.left) or code(test.left)
    if left in counters:
        at_least = isinstance(operator, (cst.GreaterThanEqual, cst.Equal))
        below = isinstance(operator, cst.LessThan)
        k = target.comparator
        value = int_value(k)
        if value is not None and value <= 1:
            return None
        if (at_least and holds) or (below and not holds):
            return (GateKind.COUNTER, k)
    return None
