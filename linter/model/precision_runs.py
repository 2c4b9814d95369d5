"""Precision per configuration: what the autocast regions, the GradScalers and the engines are
under each setting of the knobs they read together (`dtype` choosing both the autocast dtype
and whether the scaler is on).

`precision.py` answers what holds in every run; this module answers in which runs something
holds, through `config_values.joint`. A run counts as bad only when it is bad on every machine
(for both answers of `torch.cuda.is_available()` and the like), so an environment test never
makes a finding; a value the evaluator cannot tell never does either.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from linter.model import config_values as cv
from linter.model.config_values import AutocastValue, EngineValue, ScalerValue, TorchDtype
from linter.model.cst_util import code, dotted, keyword, last_part, walk
from linter.model.functions import Def, Scope
from linter.model.precision import Autocast, region_scope
from linter.model.setup import Engine, Scaler
from linter.types import Configuration


@dataclass(frozen=True)
class Verdict:
    """The runs in which a finding holds."""

    condition: cv.Condition
    rows: tuple  # the bad rows


Expr = tuple[cst.BaseExpression, Scope, int]


# what to evaluate -------------------------------------------------------------------------------
def cast_expr(model, cast: Autocast) -> Expr | None:
    """The expression a region's context comes from (`ctx` of `with ctx:`, or the autocast
    call), with the scope and the order at which the `with` reads it."""
    scope = region_scope(model, cast.region)
    if scope is None:
        return None
    inside = [
        s.order for s in scope.stmts if any(f.node is cast.region.with_node for f in s.frames)
    ]
    if not inside:
        return None
    node = cast.region.item.item if cast.region.via_name else cast.region.call
    return node, scope, min(inside)


def construction_expr(model, node: cst.CSTNode) -> Expr | None:
    """The assignment value that builds a scaler or an engine (`scaler = GradScaler(...)`, or
    `GradScaler(...) if amp else None`), where it is built."""
    table = model.memo("precision_runs.defs", _defs_by_value)
    d = table.get(id(node))
    if d is None:
        return None
    return d.value, d.stmt.scope, d.stmt.order + 1


def _defs_by_value(model) -> dict[int, Def]:
    found = {}
    for scope in model.scopes:
        for defs in scope.defs.values():
            for d in defs:
                if d.op != "=" or d.tuple_index is not None or d.value is None:
                    continue
                found[id(d.value)] = d
                value = d.value
                if isinstance(value, cst.IfExp):
                    for option in (value.body, value.orelse):
                        found.setdefault(id(option), d)
    return found


# row predicates ----------------------------------------------------------------------------------
def fp16_on_gpu(values: frozenset) -> bool:
    """Every value is an enabled fp16 autocast on a device not known to be the CPU."""
    return bool(values) and all(
        isinstance(v, AutocastValue)
        and v.enabled is True
        and v.dtype == TorchDtype("fp16")
        and v.device != "cpu"
        for v in values
    )


def bf16_autocast(values: frozenset) -> bool:
    return bool(values) and all(
        isinstance(v, AutocastValue) and v.enabled is True and v.dtype == TorchDtype("bf16")
        for v in values
    )


def may_be_fp16(values: frozenset) -> bool:
    """Some value may run fp16: an enabled fp16 autocast, or one the evaluator cannot tell."""
    for v in values:
        if v is cv.UNKNOWN:
            return True
        if isinstance(v, AutocastValue) and v.enabled is not False:
            if v.dtype in (TorchDtype("fp16"), cv.UNKNOWN) and v.device != "cpu":
                return True
    return False


def dtype_word(values: frozenset) -> str | None:
    """The one low-precision dtype all values of an enabled autocast run in, else None."""
    words = set()
    for v in values:
        if not isinstance(v, AutocastValue) or v.enabled is not True:
            return None
        if not isinstance(v.dtype, TorchDtype):
            return None
        words.add(v.dtype.word)
    return words.pop() if len(words) == 1 else None


def scaler_off(values: frozenset) -> bool:
    """No scaler scales in this run: each value a disabled scaler (or `None`)."""
    return bool(values) and all(
        v is None or (isinstance(v, ScalerValue) and v.enabled is False) for v in values
    )


def scaler_on(values: frozenset) -> bool:
    return bool(values) and all(isinstance(v, ScalerValue) and v.enabled is True for v in values)


def engine_precision(values: frozenset) -> str | None:
    """The precision every value of an engine construction runs in ("fp16"/"bf16"/"no")."""
    found = set()
    for v in values:
        if not isinstance(v, EngineValue) or v.mixed_precision not in ("fp16", "bf16", "no"):
            return None
        found.add(v.mixed_precision)
    return found.pop() if len(found) == 1 else None


# the question -------------------------------------------------------------------------------------
def runs_where(model, exprs: list[Expr], bad) -> Verdict | None:
    """The settings of the knobs the expressions read under which `bad(values)` holds on every
    machine; None when there are none, when no knob is read (the finding does not depend on the
    configuration), or when the evaluation gives up. A run is one setting changed from the
    defaults at most: a finding that needs `--fp16` and `--bf16` together is a misuse of the
    flags, not a run anyone means."""
    if any(e is None for e in exprs):
        return None
    space = cv.joint(model, exprs)
    if space is None or not space.knobs:
        return None
    defaults = {k.key: k.defaults for k in space.knobs}
    groups: dict[tuple, list] = {}
    for row in space.rows:
        part = tuple((k, v) for k, v in row.settings if k in defaults)
        if sum(v not in defaults[k] for k, v in part) <= 1:
            groups.setdefault(part, []).append(row)
    bad_rows, clean = [], []
    for rows in groups.values():
        if all(bad(r.values) for r in rows):
            bad_rows.extend(rows)
        elif not any(len(v) > 1 or cv.UNKNOWN in v for r in rows for v in r.values):
            clean.extend(rows)  # neither bad nor undecided: a run known to be right
    if not bad_rows:
        return None
    return Verdict(space.condition(bad_rows, clean), tuple(bad_rows))


def scaler_exprs(model, scalers: list[Scaler]) -> list[Expr | None]:
    return [construction_expr(model, s.node) for s in scalers]


def engine_exprs(model, engines: list[Engine]) -> list[Expr | None]:
    return [construction_expr(model, e.node) for e in engines]


# which runs a finding about an enabled scaler or autocast affects ---------------------------------
def scaler_configuration(model, name: str | None) -> Configuration | None:
    """The runs in which the GradScaler `name` scales, for a finding that is real only then:
    `GradScaler(enabled=(args.mixed_precision == 'fp16'))` with `--mixed-precision` defaulting
    to bf16 is latent. None when it scales in every run, or when its switch is not traced."""
    if not name:
        return None
    scalers = [s for s in model.setup.scalers.values() if s.name == name]
    if not scalers:
        scalers = [s for s in model.setup.scalers.values() if last_part(s.name) == last_part(name)]
    if not scalers or any(s.enabled is not None for s in scalers):
        return None  # none known, or one on (or off) in every run
    found = {
        _configuration(runs_where(model, [e], lambda v: scaler_on(v[0])))
        for e in scaler_exprs(model, scalers)
    }
    return found.pop() if len(found) == 1 else None  # built alike on every path, or untold


def autocast_configuration(model, cast: Autocast) -> Configuration | None:
    """The runs in which an autocast region runs in low precision: `autocast(enabled=args.amp)`
    with a store_true `--amp`, or `accelerator.autocast()`, a no-op unless the Accelerator's
    mixed_precision is fp16 or bf16. None when it does in every run or the switch is not
    traced (an Accelerator handed its precision through `**kwargs` from elsewhere)."""
    if cast.by_engine:
        engine = cast.engine
        if engine is None or engine.mixed_precision is not None:
            return None
        if isinstance(engine.node, cst.Call) and _default_precision(model, engine.node):
            return Configuration(
                False,
                "with the Accelerator's mixed_precision set to fp16 or bf16 (`accelerate "
                "launch --mixed_precision`, `accelerate config`; default 'no')",
                ("mixed_precision",),
            )
        verdict = runs_where(
            model, engine_exprs(model, [engine]), lambda v: engine_precision(v[0]) in _LOW
        )
        return _configuration(verdict)
    if cast.enabled is not None:
        return None
    low = (TorchDtype("fp16"), TorchDtype("bf16"))

    def on(values) -> bool:
        return bool(values[0]) and all(
            isinstance(v, AutocastValue) and v.enabled is True and v.dtype in low for v in values[0]
        )

    return _configuration(runs_where(model, [cast_expr(model, cast)], on))


_LOW = ("fp16", "bf16")


def _default_precision(model, call: cst.Call) -> bool:
    """`Accelerator(...)` that leaves mixed_precision to Accelerate's default ('no', unless the
    launcher sets it): no `mixed_precision=`, and any `**kwargs` a parameter defaulting to an
    empty dict that its function never gives the key."""
    if keyword(call, "mixed_precision") is not None:
        return False
    for arg in call.args:
        if arg.star == "*":
            return False
        if arg.star == "**" and not _empty_kwargs(model, arg.value, call):
            return False
    return True


def _empty_kwargs(model, value: cst.BaseExpression, call: cst.Call) -> bool:
    name = dotted(value)
    scope = next((s for s in model.scopes if any(c.call is call for c in s.calls)), None)
    if not name or scope is None or not isinstance(scope.node, cst.FunctionDef):
        return False
    params = scope.node.params
    param = next((p for p in params.params + params.kwonly_params if p.name.value == name), None)
    default = param.default if param is not None else None
    empty = isinstance(default, cst.Dict) and not default.elements
    empty = empty or (
        isinstance(default, cst.Call) and dotted(default.func) == "dict" and not default.args
    )
    return empty and not any(
        "mixed_precision" in code(n)
        for n in walk(scope.node)
        if isinstance(n, (cst.Subscript, cst.Call)) and name in code(n)
    )


def _configuration(verdict: Verdict | None) -> Configuration | None:
    if verdict is None or not verdict.condition.depends:
        return None
    c = verdict.condition
    return Configuration(c.affects_default, c.text, c.knobs)
