"""ACL310 schedule-length-mismatch: a scheduler sized for the wrong number of steps."""

from rules._base import Rule

RULE = Rule(
    code="ACL310",
    name="schedule-length-mismatch",
    summary="scheduler length ignores world size or accumulation: it ends W× early or N× late",
    severity="error",
    fix="none",
    runtime="heuristic",
    static=False,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags a scheduler whose length expression contains `len(X)`, X having been returned by `prepare`
earlier, when the scheduler is later passed to `prepare` with no `num_processes` compensation and
no `split_batches=True`; and, with K > 1, a length derived from `len(loader)` that is not divided
by K.

## Why is this bad?
With `split_batches=False` (the default) a prepared scheduler steps W times per optimizer step,
because Accelerate expects its length in global batches, counted on the unprepared loader. Sized
from the prepared per-process loader, it runs W times too fast: warm-up is W times shorter and the
decay ends after 1/W of training. Sized in micro-batches instead of optimizer steps under
accumulation, it runs N times too slow and never reaches its end. The two errors can cancel or
compound.

## Example
```python
model, opt, dl = accelerator.prepare(model, opt, dl)
sched = get_linear_schedule_with_warmup(opt, 500, len(dl) * epochs)   # per-process length
sched = accelerator.prepare(sched)          # stepped W times per update
```

## Use instead
```python
steps = math.ceil(len(dl) / N) * epochs     # dl not prepared yet: global batches
sched = get_linear_schedule_with_warmup(opt, 500 * accelerator.num_processes, steps)
model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
```

## Fix safety
No autofix: the intended schedule length is the user's decision.

## At runtime
Heuristic, a warning. The guard reads the schedule's own length H (`total_steps`, `T_max`,
`total_iters` of a decaying schedule; for a `LambdaLR`, the step where its factor falls below
1e-3 of its peak) and counts real optimizer steps from the scheduler's first step. A schedule that
ran out is reported during training, once the run has gone past H by half of H again (a
schedule sized per process in a 2-process run shows up this way). A schedule that stops far short
of its end is judged at exit, and only when the run ended at the end of a loader pass (a
`max_steps` budget that stops mid-epoch is not flagged). The guard cannot know the planned number
of epochs, so it does not project the end of training after the first epoch; warm-up-only
schedules, `ReduceLROnPlateau` and `SequentialLR` are not judged.
""",
)
