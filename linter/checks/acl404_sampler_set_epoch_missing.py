"""ACL404: a shuffling `DistributedSampler` whose training loader is iterated epoch after epoch
with no `set_epoch(epoch)`."""

from __future__ import annotations

import libcst as cst

from linter.context import RuleContext
from linter.model import distributed as dist
from linter.model.cst_util import code


def check(ctx: RuleContext) -> None:
    model = ctx.model
    samplers = dist.shuffling_samplers(model)
    known = {s.name for s in samplers if s.name} | {n for s in samplers for n in s.loaders}
    reported: set[int] = set()
    for sampler in samplers:
        if sampler.name and dist.prepared_by_engine(model, sampler.name):
            continue
        mine = {sampler.name, *sampler.loaders} - {None}
        for loader in sampler.loaders:
            if dist.prepared_by_engine(model, loader):
                continue
            for loop in dist.epoch_loops(model, loader):
                if id(loop.node) in reported or _told_the_epoch(model, loop, known - mine):
                    continue
                reported.add(id(loop.node))
                _report(ctx, sampler, loader, loop)


def _told_the_epoch(model, loop, foreign: set[str]) -> bool:
    """`set_epoch` anywhere in the loops around the pass, in a module function they call, or
    in the function that makes the pass (`loader.sampler.set_epoch(epoch)` at its top)."""
    if dist.sets_epoch(model, loop.outer, loop.scope, foreign):
        return True
    helper = loop.helper
    return helper is not None and dist.sets_epoch(model, helper.node, helper, foreign)


def _report(ctx, sampler, loader: str, loop) -> None:
    name = sampler.name or code(sampler.call)
    built = sampler.loaders[0]
    through = f" (as `{loader}`)" if loader != built else ""
    start, _ = ctx.span(loop.node)
    _, end = ctx.span(loop.node.iter if isinstance(loop.node, cst.For) else loop.node.test)
    rebound = sampler.name and len(loop.scope.defs.get(sampler.name, ())) > 1
    if sampler.name and not rebound and _visible(ctx, sampler, loop.scope):
        target = f"`{sampler.name}.set_epoch(epoch)`"
    elif not rebound:
        target = f"`{built}.sampler.set_epoch(epoch)`"
    else:
        target = "`set_epoch(epoch)` on the DistributedSampler"
    ctx.report(
        (start, end),
        f"`{name}` (a shuffling DistributedSampler, line {ctx.line_of(sampler.call)}) is never "
        f"told the epoch: its loader `{built}` is iterated{through} once per pass of this loop "
        "with no `set_epoch(epoch)`, so every epoch repeats the same order and the same split "
        "across ranks",
        notes=(f"call {target} at the start of each epoch",),
    )


def _visible(ctx, sampler, scope) -> bool:
    """Whether the sampler's name reaches the epoch loop: bound in its function, at module
    level or on `self` (not a local of the helper that builds the loader)."""
    where = sampler.stmt.scope
    return sampler.name.startswith("self.") or where is scope or where is ctx.model.scopes[0]
