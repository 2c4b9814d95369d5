"""ACL309: `accumulate()` entered twice per batch, several backwards per entry, or over a loader
whose end the engine cannot see."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext
from linter.model import accumulation
from linter.model.accumulation import exclusive, frames_before, innermost_loop
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code
from linter.model.gates import stepped_optimizer
from linter.model.kinds import FrameKind
from linter.model.loops import BACKWARD_KINDS, STEP_KINDS, same_path


def check(ctx: RuleContext) -> None:
    """One finding per loop iteration: two entries, then several backwards per entry, then a
    loader the engine does not track."""
    model = ctx.model
    regions = accumulation.accumulate_regions(model)
    if not regions:
        return
    reported: set[int] = set()
    # with K = 1 every entry syncs and steps: each variant is harmless there
    configuration = gate_configuration(model, None)
    for loop, entries in _entries_per_loop(model, regions).items():
        pair = _second_entry(model, entries) if len(entries) > 1 else None
        if pair is not None:
            reported.add(loop)
            (_, node, text), (_, _, first) = pair
            ctx.report(
                node,
                f"`accumulate()` entered a second time in one iteration ({text} after {first}): "
                "the micro-step counter ticks twice per batch, so the windows are half as long as "
                "configured and the models entered first almost never sync; enter once, with "
                "every model: `accumulate(m1, m2)`",
                configuration=configuration,
            )
    for region in regions:
        if id(innermost_loop(region.frames)) not in reported:
            _check_block(ctx, region, reported, configuration)


# --- two entries per iteration ---------------------------------------------------------------
def _entries_per_loop(model, regions) -> dict[int, list]:
    """id(loop) -> [(frames, node to report, description)] for every accumulate entry whose
    innermost loop is that loop: a `with` item, or a call of a helper that enters one."""
    found: dict[int, list] = {}
    for region in regions:
        loop = innermost_loop(region.frames)
        if loop is not None:
            text = f"`{code(region.call)}`"
            found.setdefault(id(loop), []).append((region.frames, region.call, text))
    helpers = {s.name for r in regions if (s := accumulation.region_scope(model, r)) is not None}
    for call in model.calls:
        if (call.func or "").rsplit(".", 1)[-1] not in helpers:
            continue
        callee = model.local_function(call.call.func, call.stmt.scope)
        loop = innermost_loop(call.stmt.frames)
        if callee is None or loop is None or not _enters_once(model, callee):
            continue
        text = f"`{call.func}(...)`, which enters it"
        found.setdefault(id(loop), []).append((call.stmt.frames, call.call, text))
    return found


def _enters_once(model, scope) -> bool:
    """A helper whose body enters `accumulate()` outside any loop of its own."""
    for region in accumulation.accumulate_regions(model):
        if (
            accumulation.region_scope(model, region) is scope
            and innermost_loop(region.frames) is None
        ):
            return True
    return False


def _second_entry(model, entries):
    """(the second entry, the first) of two entries one iteration runs both of."""

    def where(entry):
        start = model.positions.range(entry[1]).start
        return start.line, start.column

    entries = sorted(entries, key=where)
    for i, entry in enumerate(entries):
        for other in entries[:i]:
            if not exclusive(entry[0], other[0]):
                return entry, other
    return None


# --- one block ----------------------------------------------------------------------------
def _check_block(ctx: RuleContext, region, reported: set[int], configuration) -> None:
    model = ctx.model
    inner_loader = _loader_loop_inside(model, region)
    if inner_loader is not None:
        ctx.report(
            inner_loader,
            "a loader loop inside the `accumulate()` block: the whole pass counts as one "
            "micro-step, and in the outer loader's last batch every inner step syncs; put "
            "`accumulate()` inside the loop over the batches",
            configuration=configuration,
        )
        return
    extra = _extra_backward(model, region)
    if extra is not None:
        ctx.report(
            extra.call,
            "more than one backward pass in one `accumulate()` entry: the entry counts as a "
            "single micro-step, so each window spans several times the configured backward "
            "passes and its gradient is that many times the intended mean; enter "
            "`accumulate()` once per forward/backward pair",
            configuration=configuration,
        )
        return
    if accumulation.opts_out_of_loader_sync(model):
        return
    loader = _untracked_loader(model, region)
    if loader is not None and id(loader[0]) not in reported:
        reported.add(id(loader[0]))
        ctx.report(loader[1], loader[2], configuration=configuration)


def _block_sites(model, region):
    scope = accumulation.region_scope(model, region)
    if scope is None:
        return []
    return [
        s
        for s in model.sites[id(scope)]
        if s.kind in BACKWARD_KINDS and any(f.node is region.with_node for f in s.stmt.frames)
    ]


def _extra_backward(model, region):
    """A backward in a loop nested in the block, or a second one on the same path."""
    sites = _block_sites(model, region)
    for site in sites:
        inside = site.stmt.frames[len(frames_before(site.stmt.frames, region.with_node)) :]
        if any(f.kind == FrameKind.LOOP for f in inside):
            return site
    for i, site in enumerate(sites):
        for other in sites[:i]:
            if not exclusive(site.stmt.frames, other.stmt.frames) and _may_share(
                model, site, other
            ):
                if not _stepped_apart(model, region, other, site):
                    return site
    return None


def _stepped_apart(model, region, first, second) -> bool:
    """The first backward's optimizer steps before the second backward runs, and the second's
    is another optimizer: each optimizer gets one backward per entry (a GAN's generator step,
    then its discriminator step, in one `accumulate()` entry)."""
    scope = accumulation.region_scope(model, region)
    steps = sorted(
        (
            s
            for s in model.sites[id(scope)]
            if s.kind in STEP_KINDS and any(f.node is region.with_node for f in s.stmt.frames)
        ),
        key=lambda s: s.stmt.order,
    )

    def consumer(backward):
        later = (s for s in steps if s.stmt.order > backward.stmt.order)
        return next((s for s in later if same_path(s.stmt, backward.stmt)), None)

    ours, theirs = consumer(first), consumer(second)
    if ours is None or theirs is None or ours.stmt.order > second.stmt.order:
        return False
    optimizers = stepped_optimizer(ours), stepped_optimizer(theirs)
    return None not in optimizers and optimizers[0] != optimizers[1]


def _may_share(model, a, b) -> bool:
    """Two backwards add to the same gradients unless their losses visibly come from different
    models (one backward per model and window, as with two engines trained side by side)."""
    flows = [model.flow(a), model.flow(b)]
    models = [f.models if f is not None else set() for f in flows]
    return not (models[0] and models[1]) or bool(models[0] & models[1])


def _loader_loop_inside(model, region):
    scope = accumulation.region_scope(model, region)
    if scope is None:
        return None
    for loop in scope.loops:
        if not isinstance(loop, cst.For) or not _nested_in(model, scope, loop, region.with_node):
            continue
        order = _first_order_in(scope, loop)
        state = accumulation.loader_state(model, loop.iter, scope, order)
        if state in ("prepared", "unprepared"):
            return loop.iter
    return None


def _nested_in(model, scope, loop, with_node) -> bool:
    for stmt in scope.stmts:
        if any(f.node is loop for f in stmt.frames):
            outer = frames_before(stmt.frames, loop)
            return any(f.node is with_node for f in outer)
    return False


def _first_order_in(scope, loop) -> int:
    for stmt in scope.stmts:
        if any(f.node is loop for f in stmt.frames):
            return stmt.order
    return 0


def _untracked_loader(model, region):
    """(loop, node to report, message) when the loop around the block iterates a loader that
    never went through `prepare`, or draws its batches with `next(...)`."""
    loop = innermost_loop(region.frames)
    scope = accumulation.region_scope(model, region)
    if loop is None or scope is None:
        return None
    order = _first_order_in(scope, loop)
    state = "range" if isinstance(loop, cst.While) else None
    if isinstance(loop, cst.For):
        state = accumulation.loader_state(model, loop.iter, scope, order)
    if state == "unprepared":
        return (
            loop,
            loop.iter,
            "`accumulate()` over a loader that did not go through `prepare`: the engine never "
            "sees its last batch, so the tail window is not flushed and windows straddle epochs; "
            "prepare the loader",
        )
    if state == "range":
        draws = accumulation.next_calls(model, loop, scope)
        if draws:
            return (
                loop,
                draws[0].call,
                "`accumulate()` over batches drawn with `next(...)`: the engine never sees the "
                "loader end, so the tail window is not flushed and windows straddle epochs; "
                "iterate the prepared loader with `for`",
            )
    return None
