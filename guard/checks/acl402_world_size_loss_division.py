"""ACL402 (warning): a loss divided by the world size W before the backward of a DDP model, in
the user's own loop (raw `loss.backward()` or `accelerator.backward`). DDP already averages the
gradients over the W ranks, so they end W times too small. The engine's backward is judged by
`acl302_double_loss_division.engine_backward`.

The signal is the loss's graph: a constant factor at its root of 1/W, or factors whose product
is 1/(k W) for a window of k micro-batches (`loss / (K * W)`; Accelerate's own 1/K included).
It is judged at the optimizer step, when k is known, before any parameter changes. A divisor
can equal W by coincidence (`(a + b) / 2` on two ranks, `loss / K` with K = W), so the
user's source must agree: the functions on the backward's call stack divide a value that is
not a detached copy by a world-size expression (`dist.get_world_size()`, a `*world_size`
name, `num_processes`, `WORLD_SIZE`, or a name bound to one). Not judged: a factor of W on the
path (`loss * W / n_tokens`), optimizers that train no DDP model (loops that all-reduce
`p.grad` by hand need the 1/W), a DDP model with a registered communication hook (it may sum),
and W = 1. One finding per optimizer, at the division's line when the backward's own function
holds it.
"""

from __future__ import annotations

import ast
import functools
import math
import weakref
from dataclasses import dataclass, field

from guard import distributed, sources
from guard.checks import _gate, _graph
from guard.checks._common import report

CODES = ("ACL402",)
_FACTOR_ROOTS = ("DivBackward0", "MulBackward0")
_WORLD_NAMES = ("world_size", "num_processes", "WORLD_SIZE")  # get_world_size ends so too
_COPIES = ("detach", "item", "tolist", "cpu", "clone")  # a value that feeds no backward


@dataclass
class _Window:
    """One optimizer's backward passes of this window whose loss a world size may divide."""

    factors: list = field(default_factory=list)  # the candidates' root factors
    sites: tuple = ()  # the user's frames at the first candidate's backward
    reported: bool = False


def install(tracker) -> None:
    sources.ensure(tracker, "ddp")
    ddp_modules: weakref.WeakSet = weakref.WeakSet()
    hooked: weakref.WeakSet = weakref.WeakSet()  # DDP modules with a communication hook
    pending: dict = {}

    def before_backward(tensors, scaled_by, via, **_) -> None:
        pending.clear()
        if not tensors or via == "engine" or distributed.world_size() < 2:
            return
        if type(getattr(tensors[0], "grad_fn", None)).__name__ not in _FACTOR_ROOTS:
            return  # the usual case: the loss function itself is the root
        factors = _graph.root_factors(tensors[0], scaled=scaled_by is not None)
        if factors and _may_divide_by(factors, distributed.world_size()):
            pending["factors"], pending["sites"] = factors, _gate.call_sites()

    def after_backward(states, **_) -> None:
        if "factors" not in pending:
            return
        for st in states:
            window = st.of(_Window)
            if not window.factors:
                window.sites = pending["sites"]
            window.factors.append(pending["factors"])
        pending.clear()

    def before_step(optimizer, state, **_) -> None:
        window = state.of(_Window)
        if not window.factors:
            return
        factors, sites, window.factors = window.factors, window.sites, []
        if window.reported:
            return
        world, k = distributed.world_size(), max(1, state.contrib_backwards)
        if not any(_divides_by(f, world, k) for f in factors):
            return
        modules = [m for m in list(ddp_modules) if _trains(m, optimizer)]
        if not modules or any(m in hooked for m in modules):
            return
        division = _world_size_division(sites)
        if division is None:
            return  # a divisor equal to W by coincidence: the source divides by no world size
        window.reported = True
        report(
            "ACL402",
            f"the loss reaching backward is divided by the world size {world}, and DDP already "
            f"averages the gradients over the {world} processes: they end {world}x too small, "
            f"so this run trains differently on 1 and on {world} processes; remove the "
            "world-size factor from the loss",
            "warning",
            division,
        )

    tracker.subscribe("ddp_created", lambda module, **_: ddp_modules.add(module))
    tracker.subscribe("ddp_forward", lambda module, **_: ddp_modules.add(module))
    tracker.subscribe("ddp_comm_hook", lambda module, **_: hooked.add(module))
    tracker.subscribe("backward_pre", before_backward, when="ddp", sampled=True)
    tracker.subscribe("backward", after_backward, when="ddp", sampled=True)
    tracker.subscribe("optimizer_step_pre", before_step, when="ddp")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


def _may_divide_by(factors: list[float], world: int) -> bool:
    """Whether a factor or their product is 1/(m W) for a whole m (cheap: no source read)."""
    product = math.prod(factors)
    for value in (*factors, product):
        if value <= 0:
            continue
        m = 1.0 / (value * world)
        if m >= 1 - 1e-6 and _close(m, round(m)):
            return True
    return False


def _divides_by(factors: list[float], world: int, k: int) -> bool:
    """1/W alone, or 1/(k W) in all, and no factor of W on the path (token normalisation)."""
    if any(_close(f, world) for f in factors):
        return False
    product = math.prod(factors)
    return any(_close(f, 1 / world) for f in factors) or _close(product, 1 / (k * world))


def _trains(module, optimizer) -> bool:
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return any(id(p) in owned for p in module.parameters())


def _world_size_division(sites: tuple) -> str | None:
    """file:line of a division by a world size in the functions around the backward (the
    innermost first), or None when none of them divides by one."""
    return _gate.first_found(sites, _division_in_scope)


@functools.lru_cache(maxsize=64)
def _division_in_scope(filename: str, line: int) -> int | None:
    """The line that divides the loss by a world-size expression, for the call at `line`: that
    statement itself (`(loss / W).backward()`), or the last assignment before it, in the same
    function (or the module), to a name the statement reads (`loss = loss / W`, `loss /= W`)."""
    tree = _gate.parse(filename)
    path = _gate.enclosing(tree, line) if tree is not None else []
    if not path:
        return None
    statement, scope = path[-1], _scope_of(path)
    bound = _world_size_names(tree) | _world_size_names(scope)
    if any(_is_world_division(node, bound) for node in ast.walk(statement)):
        return statement.lineno
    read = {node.id for node in ast.walk(statement) if isinstance(node, ast.Name)}
    lines = [
        node.lineno
        for node in ast.walk(scope)
        if isinstance(node, (ast.Assign, ast.AugAssign))
        and node.lineno < statement.lineno
        and _targets(node) & read
        and any(_is_world_division(part, bound) for part in ast.walk(node))
    ]
    return max(lines, default=None)


def _scope_of(path: list[ast.AST]) -> ast.AST:
    """The innermost function of the enclosing statements, or the module's body."""
    functions = [n for n in path if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return functions[-1] if functions else ast.Module(body=path[:1], type_ignores=[])


def _targets(node: ast.Assign | ast.AugAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _world_size_names(scope: ast.AST) -> frozenset[str]:
    """Names assigned a world-size expression in `scope` (`W = dist.get_world_size()`)."""
    body = scope.body if isinstance(scope, ast.Module) else list(ast.walk(scope))
    return frozenset(
        target.id
        for node in body
        if isinstance(node, ast.Assign) and _names_world_size(node.value, frozenset())
        for target in node.targets
        if isinstance(target, ast.Name)
    )


def _names_world_size(expr: ast.AST, bound: frozenset[str]) -> bool:
    for node in ast.walk(expr):
        name = (
            node.id
            if isinstance(node, ast.Name)
            else node.attr
            if isinstance(node, ast.Attribute)
            else node.value
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            else None
        )
        if name is not None and (name in bound or name.endswith(_WORLD_NAMES)):
            return True
    return False


def _is_world_division(node: ast.AST, bound: frozenset[str]) -> bool:
    """`x / W` or `x /= W` where x is not a detached or host copy (a logged value)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        divided, divisor = node.left, node.right
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
        divided, divisor = node.target, node.value
    else:
        return False
    return _names_world_size(divisor, bound) and not _is_copy(divided)


def _is_copy(expr: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _COPIES
        for node in ast.walk(expr)
    )
