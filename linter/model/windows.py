"""Accumulation windows: what a loop's step gate counts, and what runs inside its window.

The window rules (ACL304 zero_grad in the window, ACL305 a scheduler stepped per micro-batch,
ACL307 a dropped tail, ACL312 an off-by-one gate) ask the same questions about a modulo step gate:
which index it reads, where that index starts, whether the gate also fires on the last batch, and
whether the loop runs over a loader with a length. The answers are built once per module.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from linter.model import iterables
from linter.model.cst_util import (
    code,
    dotted,
    int_value,
    keyword,
    last_part,
    positional,
    strip_parens,
    walk,
)
from linter.model.depths import FOLLOW_DEPTH
from linter.model.functions import Def, Scope, Stmt
from linter.model.kinds import FrameKind, GateKind, RegionKind, SiteKind
from linter.model.loops import STEP_KINDS, Gate, Site, TrainingLoop, same_path, step_gate

MANUAL_GATES = (GateKind.MODULO, GateKind.COUNTER, GateKind.MICRO_LOOP)
# Wrappers that keep their iterable's length (`enumerate(tqdm(dl))`; DeiT's
# `MetricLogger.log_every(dl, print_freq, header)`, copied by MAE, BEiT, ConvNeXt and VideoMAE,
# yields each item of `dl`).
_PROGRESS_WRAPPERS = ("tqdm", "track", "progress", "progressbar", "prefetch", "log_every")
_EMA_METHODS = ("update", "update_parameters", "step")


@dataclass(frozen=True)
class IndexBase:
    """Where the gate's index starts: its value when the gate first runs."""

    source: str  # "enumerate" (the loop's own index) | "counter" (`step += 1` in the loop)
    first: int  # the index's value at the gate on the first micro-batch
    loader: cst.BaseExpression | None  # the sized loader `enumerate` iterates, when known
    sized: bool  # whether the loop iterates a loader with a length (not `cycle`, not `while`)


@dataclass(eq=False)
class WindowGate:
    """A modulo step gate (`(i + 1) % K == 0`) and the facts the window rules read."""

    gate: Gate
    scope: Scope  # the function holding the gate's `if` (a caller's, for a per-batch function)
    loop: cst.CSTNode | None  # the loop around the gate
    condition: cst.BaseExpression  # the test, read through a name bound to it (`is_update`)
    comparison: cst.BaseExpression  # the modulo part: `(i + 1) % K == 0`
    modulo: cst.BinaryOperation  # `(i + 1) % K`
    index: str | None  # `i`
    index_node: cst.BaseExpression | None  # the `i` inside `(i + 1) % K`
    offset: int | None  # 1 for `(i + 1) % K`
    remainder: int | None  # 0 for `== 0`, -1 for `== K - 1`
    base: IndexBase | None
    last_batch_clause: bool  # `or i + 1 == len(dl)`, `or is_last`, `or accelerator.sync_gradients`
    before_backward: bool  # the gate runs before this micro-batch's backward
    k_value: int | None = None  # K's value, when the module fixes it (`ACCUM_STEPS = 4`)

    @property
    def k(self) -> cst.BaseExpression:
        return self.modulo.right

    def error(self) -> int | None:
        """0 when the gate closes windows on micro-batches K, 2K, ...; -1 when on 1, K + 1, ...
        (`i % K == 0` over a 0-based index); +1 when on K - 1, 2K - 1, ...; None if unknown.

        The gate fires when index + offset == remainder (mod K); on the n-th micro-batch the
        index is `first + n - 1` and n (n - 1 before the backward) batches have been summed, so a
        gate is on time when `first + offset - remainder` is 1 (0 before the backward)."""
        if self.base is None or self.offset is None or self.remainder is None:
            return None
        expected = 0 if self.before_backward else 1
        error = self.base.first + self.offset - self.remainder - expected
        k = self.k_value
        if k is not None and k > 1:
            error %= k
            error = error - k if error > k // 2 else error
        return error


def window_gates(model) -> list[tuple[TrainingLoop, WindowGate]]:
    """Every modulo step gate of the module, once, with the training loop it gates."""
    return model.memo("windows.gates", _build_window_gates)


def _build_window_gates(model) -> list[tuple[TrainingLoop, WindowGate]]:
    found, seen = [], set()
    for loop in model.loops:
        for gate in _candidate_gates(loop):
            if gate.kind != GateKind.MODULO or id(gate.node) in seen:
                continue
            seen.add(id(gate.node))
            window = _window_gate(model, loop, gate)
            if window is not None:
                found.append((loop, window))
                break
    return found


def _candidate_gates(loop: TrainingLoop) -> list[Gate]:
    """The loop's gate, then its steps' own: where the first is a loss scaler's `if
    update_grad:` (read at the call, its statements are not the loop's), the `if (i + 1) % K
    == 0: optimizer.step()` of the loop's other branch still frames a window."""
    gates = [loop.gate] if loop.gate is not None else []
    return gates + [g for s in loop.steps if (g := step_gate(loop, s)) is not None]


def _window_gate(model, loop: TrainingLoop, gate: Gate) -> WindowGate | None:
    """The facts of a modulo gate, or None when its test has no `X % K == R` the window rules
    can read (a remainder other than 0 or K - 1, a modulus compared the other way round)."""
    scope = gate.caller or loop.scope
    inside = [s for s in scope.stmts if any(f.node is gate.node for f in s.frames)]
    if not inside or gate.test is None or engine_only_k(model, gate.k, scope):
        return None
    condition = _resolve(gate.test, scope)
    alternatives = _alternatives(condition, gate.holds, scope)
    found = next((m for a in alternatives for m in _modulo_tests(a)), None)
    if found is None:
        return None
    comparison, modulo, remainder = found
    index_node, offset = _index_of(modulo.left)
    around = _loop_around(inside[0], gate.node)
    window = WindowGate(
        gate=gate,
        scope=scope,
        loop=around,
        condition=condition,
        comparison=comparison,
        modulo=modulo,
        index=dotted(index_node) if index_node is not None else None,
        index_node=index_node,
        offset=offset,
        remainder=remainder,
        base=None,
        last_batch_clause=len(alternatives) > 1 or _mentions_sync(condition),
        before_backward=_before_backward(model, loop, scope, around, inside),
        k_value=model.int_value(modulo.right),
    )
    if window.index is not None and around is not None:
        window.base = _enumerate_base(model, around, window.index, scope) or _counter_base(
            model, scope, around, window.index, gate, inside
        )
    return window


# the condition ------------------------------------------------------------------------------
def _resolve(test: cst.BaseExpression, scope: Scope, depth: int = 0) -> cst.BaseExpression:
    """The condition behind a name bound to it once (`is_update = (i + 1) % K == 0`)."""
    name = dotted(test)
    defs = scope.defs.get(name or "", [])
    if depth < 3 and len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
        value = defs[0].value
        if isinstance(value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation)):
            return _resolve(value, scope, depth + 1)
    return test


def _alternatives(expr, holds: bool, scope: Scope) -> list[tuple[cst.BaseExpression, bool]]:
    """The ways the update step is reached: `A or B` (or `not (A and B)`) is two of them, the
    second one being a last-batch clause beside a modulo gate."""
    expr = _resolve(strip_parens(expr), scope)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        return _alternatives(expr.expression, not holds, scope)
    if isinstance(expr, cst.BooleanOperation):
        splits = isinstance(expr.operator, cst.Or) == holds
        if splits:
            return _alternatives(expr.left, holds, scope) + _alternatives(expr.right, holds, scope)
    return [(expr, holds)]


def _modulo_tests(alternative):
    """(comparison, `X % K`, remainder) for the modulo tests of one alternative; a conjunction
    (`(i + 1) % K == 0 and i > 0`) is searched through."""
    expr, holds = alternative
    expr = strip_parens(expr)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        yield from _modulo_tests((expr.expression, not holds))
        return
    if isinstance(expr, cst.BooleanOperation):
        yield from _modulo_tests((expr.left, holds))
        yield from _modulo_tests((expr.right, holds))
        return
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo):
        if not holds:  # `not i % K`
            yield expr, expr, 0
        return
    if not isinstance(expr, cst.Comparison) or len(expr.comparisons) != 1:
        return
    target = expr.comparisons[0]
    equal = isinstance(target.operator, cst.Equal)
    if not (equal or isinstance(target.operator, cst.NotEqual)) or equal != holds:
        return  # only `== R` where it holds, or `!= R` where it fails, marks the update step
    left = strip_parens(expr.left)
    if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
        remainder = _remainder(target.comparator, left.right)
        if remainder is not None:
            yield expr, left, remainder


def _remainder(value: cst.BaseExpression, k: cst.BaseExpression) -> int | None:
    """0 for `== 0`, -1 for `== K - 1` (also a literal K - 1)."""
    number = int_value(value)
    if number == 0:
        return 0
    if number is not None and int_value(k) is not None and number == int_value(k) - 1:
        return -1
    value = strip_parens(value)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Subtract):
        if int_value(value.right) == 1 and code(strip_parens(value.left)) == code(strip_parens(k)):
            return -1
    return None


def _index_of(expr: cst.BaseExpression) -> tuple[cst.BaseExpression | None, int | None]:
    """(`i`, 1) for `(i + 1)`, (`i`, 0) for `i`."""
    expr = strip_parens(expr)
    if dotted(expr) is not None:
        return expr, 0
    if isinstance(expr, cst.BinaryOperation) and dotted(expr.left) is not None:
        number = int_value(expr.right)
        if number is not None and isinstance(expr.operator, (cst.Add, cst.Subtract)):
            return expr.left, number if isinstance(expr.operator, cst.Add) else -number
    return None, None


def _mentions_sync(expr: cst.BaseExpression) -> bool:
    """`accelerator.sync_gradients` in the gate: Accelerate also sets it on a prepared loader's
    last batch, so the tail is flushed."""
    return "sync_gradients" in code(expr)


# where the index starts ---------------------------------------------------------------------
def _loop_around(stmt: Stmt, gate_node: cst.CSTNode) -> cst.CSTNode | None:
    loops = []
    for frame in stmt.frames:
        if frame.node is gate_node:
            break
        if frame.kind == FrameKind.LOOP:
            loops.append(frame.node)
    return loops[-1] if loops else None


def _enumerate_base(model, loop: cst.CSTNode, index: str, scope: Scope) -> IndexBase | None:
    """The base of `i` in `for i, batch in enumerate(loader[, start])`."""
    if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call):
        return None
    target = loop.target
    first = target.elements[0].value if isinstance(target, (cst.Tuple, cst.List)) else None
    if first is None or dotted(first) != index or dotted(loop.iter.func) != "enumerate":
        return None
    args = positional(loop.iter)
    if not args:
        return None
    start = keyword(loop.iter, "start") or (args[1] if len(args) > 1 else None)
    value = 0 if start is None else int_value(start)
    if value is None:
        return None
    loader = _sized_loader(model, args[0], scope, loop)
    return IndexBase("enumerate", value, loader, loader is not None)


def _sized_loader(model, iterable, scope: Scope, loop: cst.For) -> cst.BaseExpression | None:
    """The loader behind `enumerate(dl)` / `enumerate(tqdm(dl))` when it has a length: not
    `cycle(dl)` or `iter(dl)`, nor a loader over an `IterableDataset`, a streaming dataset or
    a generator (`len()` raises on them), nor a name bound to one of them."""
    if isinstance(iterable, cst.Call):
        name = (dotted(iterable.func) or "").lower()
        if not any(w in name.rsplit(".", 1)[-1] for w in _PROGRESS_WRAPPERS):
            return None
        args = positional(iterable)
        return _sized_loader(model, args[0], scope, loop) if args else None
    text = dotted(iterable)
    if text is None:
        return None
    order = next((s.order for s in scope.stmts if any(f.node is loop for f in s.frames)), 0)
    if iterables.may_have_no_length(model, iterable, scope, order):
        return None
    return iterable


def _counter_base(
    model, scope: Scope, loop: cst.CSTNode, index: str, gate: Gate, inside: list[Stmt]
) -> IndexBase | None:
    """The base of a counter incremented once per micro-batch in the loop: its start value,
    plus one when the increment comes before the gate. A counter incremented on the update
    step counts optimizer steps (a logging cadence), not micro-batches, and has no base."""
    defs = scope.defs.get(index, [])
    steps = [d for d in defs if d.op == "+=" and _in_loop(d, loop)]
    starts = [d for d in defs if d not in steps]
    if len(steps) != 1 or int_value(steps[0].value) != 1 or not starts:
        return None
    step = steps[0]
    if any(f.kind == FrameKind.IF for f in step.stmt.frames_inside(loop)):
        return None
    if any(f.node is gate.node for f in step.stmt.frames):
        return None
    values = {int_value(_bound_value(d)) if d.op == "=" else None for d in starts}
    if len(values) != 1 or None in values or any(_in_loop(d, loop) for d in starts):
        return None
    first = values.pop()
    orders = [s.order for s in inside]
    if step.stmt.order < min(orders):
        first += 1
    elif step.stmt.order < max(orders):
        return None
    loader = _per_epoch_loader(model, scope, loop, starts)
    return IndexBase("counter", first, loader, loader is not None)


def _per_epoch_loader(model, scope: Scope, loop, starts: list[Def]) -> cst.BaseExpression | None:
    """The sized loader of `for batch in dl:` when the counter restarts for each pass over it
    (`step = 0` in the epoch loop, before the batch loop): then it counts the pass's
    micro-batches like an `enumerate` index. A counter set once before all epochs counts
    across them (windows span epochs on purpose)."""
    if not isinstance(loop, cst.For):
        return None
    outer = next((s.loops() for s in scope.stmts if any(f.node is loop for f in s.frames)), [])
    outer = outer[: outer.index(loop)] if loop in outer else []
    if not outer or not all(any(f.node is outer[-1] for f in d.stmt.frames) for d in starts):
        return None
    return _sized_loader(model, loop.iter, scope, loop)


def _bound_value(d: Def) -> cst.BaseExpression | None:
    """The value a definition gives its name, also from a tuple (`step, total = 0, 0`)."""
    if d.tuple_index is None:
        return d.value
    if isinstance(d.value, (cst.Tuple, cst.List)) and d.tuple_index < len(d.value.elements):
        element = d.value.elements[d.tuple_index]
        return None if isinstance(element, cst.StarredElement) else element.value
    return None


def _in_loop(d: Def, loop: cst.CSTNode) -> bool:
    return any(f.node is loop for f in d.stmt.frames)


def _before_backward(model, loop: TrainingLoop, scope: Scope, around, inside) -> bool:
    """Whether the gate runs before the micro-batch's backward (`if i % K == 0: step()` at the
    top of the loop steps the previous window)."""
    if around is None:
        return False
    work = [s.stmt.order for s in loop.backwards if s.stmt.scope is scope]
    if not work:  # a per-batch function called from the gate's loop
        work = [
            c.stmt.order
            for c in model.calls
            if c.stmt.scope is scope
            and any(f.node is around for f in c.stmt.frames)
            and model.local_function(c.call.func, scope) is loop.scope
        ]
    return bool(work) and max(s.order for s in inside) < min(work)


def edited_condition(window: WindowGate) -> tuple[cst.BaseExpression, bool]:
    """The whole condition a fix extends, and whether it holds on the update step: the `if`
    test, or the value of the name it reads (`is_update = ...`; `if not is_update: continue`)."""
    test, holds = window.gate.test, window.gate.holds
    while True:
        resolved = _resolve(test, window.scope)
        if resolved is test:
            return test, holds
        test = resolved


# what else steps the optimizer -----------------------------------------------------------------
def tail_flushed_elsewhere(model, window: WindowGate) -> bool:
    """Another optimizer step outside this gate: in another branch of the loop, or after the
    loop in the same function (`if (i + 1) % K: opt.step()` once the epoch is over)."""
    node = window.gate.node
    same_test = code(window.comparison)
    for sites in model.sites.values():
        for site in sites:
            if site.kind not in STEP_KINDS or site.stmt.scope is not window.scope:
                continue
            if any(f.node is node for f in site.stmt.frames):
                continue
            if any(f.test is not None and code(f.test) == same_test for f in site.stmt.frames):
                continue  # gated alike: the other arm's `if` or `update_grad=` of a scaler call
            in_loop = window.loop is not None and any(
                f.node is window.loop for f in site.stmt.frames
            )
            after = window.loop is not None and site.stmt.order > _last_order(window)
            if in_loop or after:
                return True
    return False


def _last_order(window: WindowGate) -> int:
    orders = [s.order for s in window.scope.stmts if any(f.node is window.loop for f in s.frames)]
    return max(orders, default=0)


# the window's statements ----------------------------------------------------------------------
def manual_window(model, loop: TrainingLoop, stmt: Stmt) -> Gate | None:
    """The manual accumulation gate (K > 1) of the path through `stmt`, else None: loops that
    step every batch, and loops that enter `accumulate()`, have no manual window."""
    gate = model.gate_for(loop, stmt)
    if gate is None or gate.kind not in MANUAL_GATES or gate.k is None:
        return None
    value = model.fixed_int(gate.k)
    if (value is not None and value <= 1) or engine_only_k(model, gate.k, loop.scope):
        return None
    if _accumulates(model, loop):
        return None  # prepared optimizers and schedulers act only on the engine's sync steps
    return gate


def engine_only_k(model, k: cst.BaseExpression | None, scope: Scope) -> bool:
    """K is above 1 only under DeepSpeed (`K = ds_config["gradient_accumulation_steps"] if
    accelerator.state.deepspeed_plugin else 1`): there the engine accumulates and steps by
    itself (the prepared optimizer's `step()` does nothing), and elsewhere K is 1, so the gate
    makes no window."""
    value = _bound_once(model, k, scope) if k is not None else None
    if not isinstance(value, cst.IfExp):
        return False
    test, negated = strip_parens(value.test), False
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, negated = strip_parens(test.expression), not negated
    if "deepspeed" not in code(test).lower():
        return False
    return int_value(value.body if negated else value.orelse) == 1


def _bound_once(model, expr: cst.BaseExpression, scope: Scope) -> cst.BaseExpression | None:
    """The expression itself, or the one value a name is bound to (in its function, an
    enclosing one, or the module)."""
    expr = strip_parens(expr)
    text = dotted(expr)
    if text is None:
        return expr
    defs = []
    while scope is not None and not defs:
        defs = scope.defs.get(text, [])
        scope = scope.parent
    defs = defs or model.module_defs(text)
    if len(defs) == 1 and defs[0].op == "=" and defs[0].tuple_index is None:
        return strip_parens(defs[0].value)
    return None


def single_pass(model, window: WindowGate) -> bool:
    """No epoch loop around the gate's loop, in its function or around the calls of it: the
    loader is iterated once, so its end is the end of training."""
    if window.loop is None or model.graph.called_in_loop(window.scope):
        return False
    stmts = _loop_stmts(window)
    return bool(stmts) and stmts[0].loops().index(window.loop) == 0


def discarded_between_passes(model, window: WindowGate) -> Site | None:
    """A `zero_grad` in the loop around the gate's loop but outside it (at the start or the end
    of each epoch), or outside it in a function called once per epoch (`train_one_epoch()`
    zeroes before its loop): the tail's gradients never reach the next epoch, they are thrown
    away."""
    stmts = _loop_stmts(window)
    if window.loop is None or not stmts:
        return None
    loops = stmts[0].loops()
    at = loops.index(window.loop)
    per_epoch = at == 0 and model.graph.called_in_loop(window.scope)  # `train_one_epoch()`
    if at == 0 and not per_epoch:
        return None
    outer = loops[at - 1] if at > 0 else None
    for sites in model.sites.values():
        for site in sites:
            frames = site.stmt.frames
            if site.kind != SiteKind.ZERO_GRAD or site.stmt.scope is not window.scope:
                continue
            inside = any(f.node is window.loop for f in frames)
            if not inside and (per_epoch or any(f.node is outer for f in frames)):
                return site
    return None


def skips_partial_windows(model, window: WindowGate) -> bool:
    """An early `continue`/`break` of the gate's loop, before its backward, on the count of full
    windows (ConvNeXt's `step = data_iter_step // update_freq; if step >= steps_per_epoch:
    continue`): the micro-batches past the last full window are never run, as with
    `drop_last`."""
    if window.index is None:
        return False
    backwards = [
        site.stmt.order
        for site in model.sites.get(id(window.scope), [])
        if site.kind in (SiteKind.BACKWARD, SiteKind.ENGINE_BACKWARD)
        and any(f.node is window.loop for f in site.stmt.frames)
    ]
    if not backwards:
        return False
    k = code(window.k)
    counts = {
        d.target
        for defs in window.scope.defs.values()
        for d in defs
        if d.op == "=" and _floor_divides(d.value, window.index, k)
    }
    for s in _loop_stmts(window):
        if not isinstance(s.node, (cst.Continue, cst.Break)) or s.loops()[-1] is not window.loop:
            continue
        if s.order > min(backwards):
            continue  # the micro-batch it ends on was backpropagated already
        for frame in s.frames_inside(window.loop):
            test = frame.test if frame.kind in (FrameKind.IF, FrameKind.EXIT) else None
            if test is None:
                continue
            names = {n.value for n in walk(test) if isinstance(n, cst.Name)}
            if names & counts or _floor_divides(test, window.index, k):
                return True
    return False


def _floor_divides(node, index: str, k: str) -> bool:
    """`index // K` somewhere in `node`."""
    return node is not None and any(
        isinstance(n, cst.BinaryOperation)
        and isinstance(n.operator, cst.FloorDivide)
        and dotted(n.left) == index
        and code(n.right) == k
        for n in walk(node)
    )


def ends_on_a_budget(model, window: WindowGate) -> bool:
    """The gate's loop has a `break` of its own on a budget that can come before the loader's
    end (`if iter_num > max_iters: break` with `max_iters = 600000`, a step-based run). Not one:
    a budget the code sizes from passes over the data (an epoch count, a length, a sample count
    over the batch size: lit-llama's `num_epochs * (epoch_size // micro_batch_size)`), which a
    single pass ends before (catalogue: "in the final epoch they are lost")."""
    return any(not _sized_by_passes(model, b, window.scope) for b in _budgets(window))


def _budgets(window: WindowGate) -> list[cst.BaseExpression]:
    """The budget of each `if counter >= budget: break` of the gate's loop itself."""
    found = []
    for s in _loop_stmts(window):
        if not isinstance(s.node, cst.Break) or s.loops()[-1] is not window.loop:
            continue
        for frame in s.frames_inside(window.loop):
            if frame.node is window.gate.node:
                continue  # the gate's own test counts micro-batches, it sets no budget
            if (
                frame.kind in (FrameKind.IF, FrameKind.EXIT)
                and frame.holds
                and frame.test is not None
            ):
                found.extend(_budget_sides(frame.test))
    return found


def _budget_sides(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`budget` in `counter >= budget` (`>`, `==`) or `budget <= counter` (`<`)."""
    test = strip_parens(test)
    if isinstance(test, cst.BooleanOperation):
        return _budget_sides(test.left) + _budget_sides(test.right)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return []
    target = test.comparisons[0]
    left, right = strip_parens(test.left), strip_parens(target.comparator)
    if isinstance(target.operator, (cst.GreaterThanEqual, cst.GreaterThan, cst.Equal)):
        counter, budget = left, right
    elif isinstance(target.operator, (cst.LessThanEqual, cst.LessThan)):
        counter, budget = right, left
    else:
        return []
    if isinstance(counter, cst.BaseNumber) or any(
        isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo)
        for n in walk(counter)
    ):
        return []  # `0 < x`, `step % log_every == 0`: no count run up to a budget
    return [budget]


def _sized_by_passes(model, budget: cst.BaseExpression, scope: Scope, depth: int = 0) -> bool:
    """The budget reads, through its bindings, `len(...)`, an epoch count (`num_epochs`,
    `epoch_size`) or a division by a batch size (`50000 * 3 // micro_batch_size` batches)."""
    if depth > FOLLOW_DEPTH:
        return False
    for node in walk(budget):
        if isinstance(node, cst.Call) and dotted(node.func) == "len":
            return True
        if isinstance(node, cst.BinaryOperation) and isinstance(
            node.operator, (cst.FloorDivide, cst.Divide)
        ):
            if "batch_size" in last_part(dotted(strip_parens(node.right))).lower():
                return True
        text = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
        if text is None:
            continue
        if "epoch" in last_part(text).lower():
            return True
        for d in _bindings(model, text, scope):
            if d.value is not None and _sized_by_passes(model, d.value, d.stmt.scope, depth + 1):
                return True
    return False


def _bindings(model, text: str, scope: Scope | None) -> list[Def]:
    defs: list[Def] = []
    while scope is not None and not defs:
        defs = scope.defs.get(text, [])
        scope = scope.parent
    return defs or model.module_defs(text)


def _loop_stmts(window: WindowGate) -> list[Stmt]:
    return [s for s in window.scope.stmts if any(f.node is window.loop for f in s.frames)]


def _accumulates(model, loop: TrainingLoop) -> bool:
    """Whether the loop enters `accumulate()` anywhere in its body."""
    return any(
        r.kind == RegionKind.ACCUMULATE and any(f.node is loop.node for f in r.frames)
        for r in model.regions
    )


def zeroing_micro_loop(loop: TrainingLoop, stmt: Stmt) -> bool:
    """`stmt` is in a micro-step loop (`for micro_step in range(K):`) that runs the backward,
    while the optimizer steps once after it: the model sees no window there (the loop zeroes
    itself), but each zero_grad in it keeps only the last micro-batch of the update."""
    node = loop.micro_loop
    if node is None or loop.gate is not None or not _inside(stmt, node):
        return False
    if not any(_inside(b.stmt, node) for b in loop.backwards):
        return False
    inside = [_inside(s.stmt, node) for s in loop.steps]
    return bool(inside) and not any(inside)  # a critic loop (WGAN) steps inside its own loop


def steps_after_micro_loop(loop: TrainingLoop) -> list[Site]:
    """The optimizer steps of the loop outside its micro-step loop."""
    node = loop.micro_loop
    return [s for s in loop.steps if node is not None and not _inside(s.stmt, node)]


def _inside(stmt: Stmt, node: cst.CSTNode) -> bool:
    return any(f.node is node for f in stmt.frames)


def runs_every_iteration(loop: TrainingLoop, stmt: Stmt) -> bool:
    """No `if` between the loop and the statement: a test of ours or the user's (a window
    start `if i % K == 0:`, a skip test, an epoch-end test) may make it run once per window."""
    return not any(f.kind == FrameKind.IF for f in loop.frames_of(stmt))


def accumulates_more_than_once(model, receiver: str | None) -> bool:
    """Whether `accumulate()` of this engine spans several micro-steps: not for an engine built
    here with no accumulation value, or with a literal 1."""
    engine = model.setup.engines.get(receiver or "")
    if engine is None:
        return True
    if engine.accum is None:
        return engine.node is None
    value = model.fixed_int(engine.accum)
    return value is None or value > 1


def update_steps(model, loop: TrainingLoop, stmt: Stmt) -> list[Site]:
    """The optimizer steps of the loop that run on the update step of the path through `stmt`,
    in its function."""
    return [
        s
        for s in loop.steps
        if s.stmt.scope is stmt.scope
        and same_path(s.stmt, stmt)
        and model.on_update_step(loop, s.stmt)
    ]


def after_step(model, loop: TrainingLoop, step: Site, skip: tuple[str, ...]) -> Stmt:
    """The statement a moved call goes after: the step, or the run of `skip` sites (such as
    `scaler.update()`) that follows it in the same block."""
    last = step.stmt
    by_order = {s.stmt.order: s for s in loop.sites if s.stmt.scope is step.stmt.scope}
    while True:
        following = by_order.get(last.order + 1)
        if following is None or following.kind not in skip:
            return last
        if [id(f.node) for f in following.stmt.frames] != [id(f.node) for f in last.frames]:
            return last
        last = following.stmt


def is_plateau_step(model, site: Site) -> bool:
    """`ReduceLROnPlateau.step(metric)` (or an old-style `sched.step(epoch)`): a scheduler
    driven by a metric or an epoch number, not by optimizer steps."""
    if site.call is not None and site.call.args:
        return True
    built = model.setup.schedulers.get(site.receiver or "")
    return isinstance(built, cst.Call) and "Plateau" in (dotted(built.func) or "")


def ema_updates(model, loop: TrainingLoop) -> list:
    """Calls that update an exponential moving average of the weights (`ema.update(model)`)."""
    found = []
    for call in model.calls:
        receiver = (call.receiver or "").rsplit(".", 1)[-1].lower()
        if call.method in _EMA_METHODS and "ema" in receiver.split("_"):
            if any(f.node is loop.node for f in call.stmt.frames) or (
                loop.node is call.stmt.scope.node
            ):
                found.append(call)
    return found


def same_block(a: Stmt, b: Stmt) -> bool:
    return [id(f.node) for f in a.frames] == [id(f.node) for f in b.frames]


# --show-loops -----------------------------------------------------------------------------------
def describe(model, loop: TrainingLoop) -> dict | None:
    """The step gate's window as the window rules read it: the gate, its index and base, its
    last-batch clause, the loader, and where zero_grad and the scheduler run relative to it."""
    window = next((w for lp, w in window_gates(model) if lp is loop), None)
    if window is None and loop.gate is None:
        return None
    facts: dict = {"gate": loop.gate.kind if loop.gate is not None else None}
    if window is not None:
        base = window.base
        facts.update(
            {
                "condition": code(window.comparison),
                "index": window.index,
                "index_base": None if base is None else f"{base.first} ({base.source})",
                "loader": code(base.loader) if base and base.loader is not None else None,
                "last_batch_clause": window.last_batch_clause,
                "before_backward": window.before_backward,
                "fires_off_by": window.error(),
            }
        )
    for kind, key in ((SiteKind.ZERO_GRAD, "zero_grad"), (SiteKind.SCHED_STEP, "scheduler_step")):
        facts[key] = [
            {"line": model.line(s.call), "where": _where(model, loop, s)}
            for s in loop.of_kind(kind)
        ]
    return facts


def _where(model, loop: TrainingLoop, site: Site) -> str:
    if model.on_update_step(loop, site.stmt):
        return "update step"
    if model.regions_around(site.stmt, RegionKind.ACCUMULATE):
        return "inside accumulate()"
    return "every micro-step" if runs_every_iteration(loop, site.stmt) else "under another test"
