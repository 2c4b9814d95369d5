"""ACL303's static check (the record and docs: `rules/acl303_per_microstep_clipping.py`)."""

from __future__ import annotations

import libcst as cst

from linter.context import make_fix
from linter.model.cst_util import code, dotted, int_value, walk


def check(ctx) -> None:
    """Report clip/unscale calls that run on micro-steps where the optimizer does not step."""
    model = ctx.model
    for loop in model.loops:
        found = []
        for site in loop.of_kind("clip", "unscale"):
            if model.on_update_step(loop, site.stmt, site.call):
                continue
            regions = model.regions_around(site.stmt, "accumulate")
            if regions and _accumulates_once(model, regions[-1].receiver):
                continue
            if regions:
                receiver = regions[-1].receiver or "accelerator"
                found.append((site, f"{receiver}.sync_gradients", f"`{receiver}.accumulate`"))
            else:
                gate = model.gate_for(loop, site.stmt)
                if _gated_manually(gate, site):
                    found.append((site, _condition(gate), "a manual accumulation loop"))
        for run in _runs(found):
            _report_run(ctx, run)


def _accumulates_once(model, receiver) -> bool:
    """An engine built with a literal `gradient_accumulation_steps=1`: every step syncs."""
    engine = model.setup.engines.get(receiver or "")
    value = int_value(engine.accum) if engine is not None else None
    return value is not None and value <= 1


def _runs(found):
    """Group adjacent flagged statements of one block: one `if` then covers them all."""
    runs = []
    for item in found:
        site, condition, _ = item
        if runs:
            previous, previous_condition, _ = runs[-1][-1]
            adjacent = site.stmt.order == previous.stmt.order + 1
            same_block = [id(f.node) for f in site.stmt.frames] == [
                id(f.node) for f in previous.stmt.frames
            ]
            if adjacent and same_block and condition == previous_condition:
                runs[-1].append(item)
                continue
        runs.append([item])
    return runs


def _gated_manually(gate, site) -> bool:
    if gate is None or gate.kind == "accumulate":
        return False
    if int_value(gate.k) is not None and int_value(gate.k) <= 1:
        return False
    if gate.kind == "micro-loop":
        return any(f.node is gate.node for f in site.stmt.frames)
    return True


def _condition(gate) -> str | None:
    """The step condition as text, when it can be repeated without side effects."""
    if gate.test is None or gate.caller is not None:
        return None  # a caller's condition reads names this function does not have
    for node in walk(gate.test):
        if isinstance(node, cst.Call) and dotted(node.func) != "len":
            return None
        if isinstance(node, (cst.NamedExpr, cst.Await, cst.Yield, cst.Lambda)):
            return None
    text = code(gate.test)
    return text if gate.holds else f"not ({text})"


def _report_run(ctx, run) -> None:
    condition = run[0][1]
    fix = None
    if condition is not None and not any(_binds_name_read_elsewhere(s.stmt) for s, _, _ in run):
        edit = ctx.wrap_in_if([s.stmt.line for s, _, _ in run], condition)
        fix = make_fix(f"Run it only when `{condition}`", edit)
    for site, _, where in run:
        _report(ctx, site, condition, where, fix)


def _report(ctx, site, condition: str | None, where: str, fix) -> None:
    name = site.call.func
    label = code(name.attr if hasattr(name, "attr") else name)
    hint = f"gate it on `{condition}`" if condition else "move it to the optimizer-step branch"
    ctx.report(
        site.call,
        f"`{label}` runs on every micro-step in {where}, not only when the optimizer steps: "
        f"it clips/unscales partial gradient sums ({hint})",
        fix,
    )


def _binds_name_read_elsewhere(stmt) -> bool:
    node = stmt.node
    targets = []
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
        targets = [node.target]
    names = {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}
    return any(stmt.scope.reads_elsewhere(name, stmt) for name in names)
