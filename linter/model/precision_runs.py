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
from linter.model.functions import Def, Scope
from linter.model.precision import Autocast, region_scope
from linter.model.setup import Engine, Scaler


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
