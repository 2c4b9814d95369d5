"""ACL303's static check (the record and docs: `rules/acl303_per_microstep_clipping.py`)."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext, make_fix
from linter.edits import consecutive, move_before
from linter.model import windows
from linter.model.config_space import gate_configuration, k_configuration
from linter.model.cst_util import code, dotted, walk
from linter.model.kinds import FrameKind, GateKind, RegionKind, SiteKind


def check(ctx: RuleContext) -> None:
    """Report clip/unscale calls that run on micro-steps where the optimizer does not step."""
    model = ctx.model
    for loop in model.loops:
        found = []
        gates = {}  # id(site) -> its manual gate
        configs = {}  # id(site) -> the configuration of the K it depends on
        for site in loop.of_kind(SiteKind.CLIP, SiteKind.UNSCALE):
            if model.on_update_step(loop, site.stmt, site.call):
                continue
            regions = model.regions_around(site.stmt, RegionKind.ACCUMULATE)
            if regions and _accumulates_once(model, regions[-1].receiver):
                continue
            if regions:
                receiver = regions[-1].receiver or "accelerator"
                found.append((site, f"{receiver}.sync_gradients", f"`{receiver}.accumulate`"))
                configs[id(site)] = k_configuration(model, model.engine_k(receiver))
            else:
                gate = model.gate_for(loop, site.stmt)
                if _gated_manually(model, gate, site):
                    found.append((site, _condition(gate), "a manual accumulation loop"))
                    gates[id(site)] = gate
                    configs[id(site)] = gate_configuration(model, gate, site.stmt.scope)
        whole = _whole_ifs(found)
        for run in _runs(found):
            unit = whole.get(id(run[0][0]))
            anchor = _step_anchor(model, loop, gates.get(id(run[0][0])), run)
            if unit is not None and anchor is not None:
                anchor = _STAYS  # a whole `if` statement does not move
            _report_run(ctx, run, anchor, unit, configs)


def _accumulates_once(model, receiver) -> bool:
    """An engine built with a literal `gradient_accumulation_steps=1`: every step syncs."""
    engine = model.setup.engines.get(receiver or "")
    value = model.fixed_int(engine.accum) if engine is not None else None
    return value is not None and value <= 1


def _runs(found):
    """Group adjacent flagged statements of one block: one `if` then covers them all. Clips
    that are every branch of one `if`/`elif`/`else` form a run of their own, gated as a whole
    statement (gating the lines from the first branch to the last would nest `else:` too)."""
    runs = []
    whole = _whole_ifs(found)
    for item in found:
        site, condition, _ = item
        unit = whole.get(id(site))
        if runs:
            previous, previous_condition, _ = runs[-1][-1]
            previous_unit = whole.get(id(previous))
            if unit is not None or previous_unit is not None:
                if unit is previous_unit:
                    runs[-1].append(item)
                    continue
            elif condition == previous_condition and consecutive(
                site.stmt.scope.node, [previous.stmt.line, site.stmt.line]
            ):
                runs[-1].append(item)
                continue
        runs.append([item])
    return runs


def _whole_ifs(found) -> dict[int, cst.If]:
    """id(site) -> the `if` statement around it when each branch of that statement (two or
    more, through `elif`s) holds only flagged one-statement lines with one condition, and its
    tests can be evaluated less often without side effects."""
    condition_of = {id(site.stmt.line): condition for site, condition, _ in found}
    whole = {}
    for site, condition, _ in found:
        frames = site.stmt.frames
        if not frames or frames[-1].kind != FrameKind.IF or condition is None:
            continue
        i = len(frames) - 1
        while i > 0 and frames[i - 1].kind == FrameKind.IF and not frames[i - 1].holds:
            if frames[i - 1].node.orelse is not frames[i].node:
                break
            i -= 1
        top = frames[i].node
        branches = _branches(top)
        if branches is None or len(branches) < 2:
            continue
        lines = [line for branch in branches for line in branch]
        if not any(line is site.stmt.line for line in lines):
            continue  # deeper, e.g. in a `try:` inside the branch
        if all(condition_of.get(id(line), object()) == condition for line in lines):
            if all(_pure(test) for test in _tests(top)):
                whole[id(site)] = top
    return whole


def _branches(node: cst.If):
    """The statements of each branch of an `if`/`elif`/`else` chain; None for one-line ones."""
    branches = []
    while True:
        if not isinstance(node.body, cst.IndentedBlock):
            return None
        branches.append(list(node.body.body))
        if isinstance(node.orelse, cst.If):
            node = node.orelse
            continue
        if node.orelse is not None:
            if not isinstance(node.orelse.body, cst.IndentedBlock):
                return None
            branches.append(list(node.orelse.body.body))
        return branches


def _tests(node: cst.If):
    while isinstance(node, cst.If):
        yield node.test
        node = node.orelse


def _gated_manually(model, gate, site) -> bool:
    if gate is None or gate.kind == GateKind.ACCUMULATE:
        return False
    value = model.fixed_int(gate.k)
    if value is not None and value <= 1:
        return False
    if gate.kind == GateKind.MICRO_LOOP:
        return any(f.node is gate.node for f in site.stmt.frames)
    return True


def _condition(gate) -> str | None:
    """The step condition as text, when it can be repeated without side effects."""
    if gate.test is None or gate.caller is not None:
        return None  # a caller's condition reads names this function does not have
    if not _pure(gate.test):
        return None
    text = code(gate.test)
    return text if gate.holds else f"not ({text})"


def _pure(test) -> bool:
    """No calls (but `len`), walrus, await, yield or lambda: evaluating it again or less often
    computes the same."""
    for node in walk(test):
        if isinstance(node, cst.Call) and dotted(node.func) != "len":
            return False
        if isinstance(node, (cst.NamedExpr, cst.Await, cst.Yield, cst.Lambda)):
            return False
    return True


def _step_anchor(model, loop, gate, run):
    """The first optimizer step of the gate's branch, when the clip must move there rather than
    be wrapped in the gate's condition where it stands: a write between the clip and the gate
    of a name the condition reads (`step += 1` after it: the copied test would be one micro-step
    off), gradients divided in the branch (the clip must see the averaged gradients), or a gate
    another fix rewrites (ACL307 adds a last-batch clause, ACL312 shifts an off-by-one test),
    which a copy would miss.
    None when wrapping in place keeps the meaning."""
    if gate is not None and gate.kind == GateKind.MICRO_LOOP:
        return _step_after_micro_loop(loop, gate, run)
    if gate is None or gate.kind not in (GateKind.MODULO, GateKind.COUNTER) or gate.test is None:
        return None
    steps = sorted(
        (s.stmt for s in loop.steps if any(f.node is gate.node for f in s.stmt.frames)),
        key=lambda stmt: stmt.order,
    )
    if not steps:
        return None
    under_own = _frames_outside(steps[0], gate.node) != _frame_ids(run[0][0].stmt)
    last = run[-1][0].stmt
    read = {n.value for n in walk(gate.test) if isinstance(n, cst.Name)}
    written = {
        name
        for name, defs in last.scope.defs.items()
        if any(last.order < d.stmt.order < steps[0].order for d in defs)
    }
    divided = any(
        s.kind == SiteKind.GRAD_DIV
        and s.stmt.order < steps[0].order
        and any(f.node is gate.node for f in s.stmt.frames)
        for s in loop.sites
    )
    rewritten = any(
        w.gate.node is gate.node and (_gains_last_batch_clause(w) or w.error() not in (0, None))
        for _, w in windows.window_gates(model)
    )  # ACL307 adds a last-batch clause, ACL312 shifts an off-by-one test
    if under_own:
        # under a condition of its own (`if args.fp16:`) it cannot move into the update-step branch;
        # a gate copied in place that would read other values than the step's: no fix
        return _STAYS if read & written or divided else None
    return steps[0] if read & written or divided or rewritten else None


_STAYS = object()  # a run that must not be gated where it stands, and cannot move either


def _gains_last_batch_clause(window) -> bool:
    """An `enumerate` index over a sized loader with no last-batch clause: ACL307's signal."""
    base = window.base
    sized_enumerate = base is not None and base.source == "enumerate" and base.sized
    return sized_enumerate and not window.last_batch_clause


def _step_after_micro_loop(loop, gate, run):
    """The first optimizer step after the micro-step loop, in the block that holds the loop
    (`for micro_step in range(K): ... backward()` then `opt.step()`): the clip moves there."""
    block = _frames_outside(run[0][0].stmt, gate.node)
    if _frame_ids(run[0][0].stmt) != [*block, id(gate.node)]:
        return None  # under a condition inside the micro-step loop: keep it
    after = [
        s.stmt
        for s in loop.steps
        if s.stmt.order > run[-1][0].stmt.order
        and not any(f.node is gate.node for f in s.stmt.frames)
        and _frame_ids(s.stmt) == block
    ]
    return min(after, key=lambda stmt: stmt.order) if after else None


def _frame_ids(stmt) -> list[int]:
    return [id(f.node) for f in stmt.frames]


def _frames_outside(stmt, node) -> list[int]:
    """The frames of `stmt` up to (not including) the micro-step loop `node`."""
    ids = []
    for frame in stmt.frames:
        if frame.node is node:
            return ids
        ids.append(id(frame.node))
    return ids


def _report_run(ctx, run, anchor=None, unit=None, configs=None) -> None:
    """One fix for the run: move it before the step `anchor`, or gate it where it stands (a
    whole `if` statement `unit` when its branches are the run)."""
    condition = run[0][1]
    fix = None
    if any(_binds_name_read_elsewhere(s.stmt) for s, _, _ in run):
        pass  # `norm = clip(...)` read later: moving or gating it would change what is read
    elif anchor is _STAYS:
        pass
    elif anchor is not None:
        edits = move_before(ctx, [s.stmt for s, _, _ in run], anchor)
        fix = make_fix("Move it into the update-step branch", *(edits or []))
    elif condition is not None:
        lines = [unit] if unit is not None else [s.stmt.line for s, _, _ in run]
        edit = ctx.wrap_in_if(lines, condition)
        fix = make_fix(f"Run it only when `{condition}`", edit)
    _report(ctx, run, condition, fix, (configs or {}).get(id(run[0][0])))


def _report(ctx, run, condition: str | None, fix, configuration=None) -> None:
    """One finding for the run: adjacent unscale and clip calls are one misplaced block (one
    cause, one fix), reported over the span from the first call to the last."""
    labels = list(dict.fromkeys(_label(site.call) for site, _, _ in run))  # one per name
    where = run[0][2]
    one = len(labels) == 1
    named = f"`{labels[0]}`" if one else ", ".join(f"`{x}`" for x in labels[:-1])
    if not one:
        named += f" and `{labels[-1]}`"
    it = "it" if one else "them"
    hint = f"gate {it} on `{condition}`" if condition else f"move {it} to the update-step branch"
    start, _ = ctx.span(run[0][0].call)
    _, end = ctx.span(run[-1][0].call)
    ctx.report(
        (start, end),
        f"{named} {'runs' if one else 'run'} on every micro-step in {where}, not only when the "
        f"optimizer steps: {'it clips/unscales' if one else 'they clip/unscale'} partial gradient "
        f"sums ({hint})",
        fix,
        configuration=configuration,
    )


def _label(call: cst.Call) -> str:
    name = call.func
    return code(name.attr if hasattr(name, "attr") else name)


def _binds_name_read_elsewhere(stmt) -> bool:
    node = stmt.node
    targets = []
    if isinstance(node, cst.Assign):
        targets = [t.target for t in node.targets]
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
        targets = [node.target]
    names = {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}
    return any(stmt.scope.reads_elsewhere(name, stmt) for name in names)
