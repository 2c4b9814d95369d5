"""ACL310: a scheduler sized in per-process batches, or in micro-batches under accumulation."""

from __future__ import annotations

from linter.context import RuleContext
from linter.model.config_space import gate_configuration
from linter.model.cst_util import code
from linter.model.schedules import (
    accumulation_value,
    prepare_engine,
    schedules,
    splits_batches,
    steps_apart_from_optimizer,
    steps_per_update,
)


def check(ctx: RuleContext) -> None:
    """Report each schedule whose length counts the wrong thing (one finding, both reasons)."""
    model = ctx.model
    for schedule in schedules(model):
        per_process = _per_process(ctx, schedule)
        micro, loop = _micro_batches(ctx, schedule)
        reasons = [r for r in (per_process, micro) if r]
        if reasons:
            # K's setting decides the micro-batch reason alone; a per-process length is wrong
            # whenever more than one process runs, whatever the script's flags
            config = None
            if per_process is None and loop is not None:
                config = gate_configuration(model, loop.gate, loop.scope)
            ctx.report(
                schedule.length,
                f"`{schedule.parameter}` of `{schedule.name}`: " + "; and ".join(reasons),
                configuration=config,
            )


def _per_process(ctx, schedule) -> str | None:
    """A per-process `len(loader)` in a scheduler that `prepare` wraps: the wrapper steps it
    W times per optimizer step. Not with `split_batches=True` or
    `step_scheduler_with_optimizer=False` (one step per call), nor when the length is multiplied
    by the number of processes; an unprepared scheduler stepped by hand counts per-process
    steps, which is right for it."""
    model = ctx.model
    if schedule.prepare is None or splits_batches(model) or steps_apart_from_optimizer(model):
        return None
    for found in schedule.loader_lengths:
        if found.per_process and found.w_power <= 0:
            engine = prepare_engine(schedule.prepare) or "accelerator"
            return (
                f"`{code(found.call)}` counts the batches of one process (`{found.loader}` "
                f"comes from `prepare`), but the scheduler prepared at line "
                f"{ctx.line_of(schedule.prepare)} steps `{engine}.num_processes` times per "
                "optimizer step, so the schedule ends that many times too early. Compute the "
                f"length from the loader before `prepare`, or multiply it by "
                f"`{engine}.num_processes`"
            )
    return None


def _micro_batches(ctx, schedule):
    """A `len(loader)`-based length not divided by K, for a scheduler that advances once per
    optimizer step. A scheduler stepped on every micro-step is ACL305's finding (and then a
    length in micro-batches matches it). Returns (the reason, the loop it is about)."""
    model = ctx.model
    for loop, site in schedule.steps:
        k = accumulation_value(model, loop)
        if k is None or not steps_per_update(model, schedule, loop, site):
            continue
        for found in schedule.loader_lengths:
            if found.k_power >= 0:
                return (
                    f"the length counts micro-batches (`{code(found.call)}` is not divided by "
                    f"K = `{code(k)}`, or is multiplied back by it), but the scheduler steps once "
                    f"per optimizer step (line {ctx.line_of(site.call)}), so it runs K times too "
                    "slowly and never reaches its end. Count optimizer steps: "
                    f"`math.ceil({code(found.call)} / {code(k)})` per epoch"
                ), loop
    return None, None
