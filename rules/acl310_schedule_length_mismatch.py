"""ACL310 schedule-length-mismatch: a scheduler sized for the wrong number of steps."""

from rules._base import Rule

RULE = Rule(
    code="ACL310",
    name="schedule-length-mismatch",
    summary="scheduler length ignores world size or accumulation: it ends W× early or K× late",
    severity="error",
    fix="none",
    runtime="heuristic",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Follows the length argument of a scheduler (`num_training_steps` of `get_scheduler` and the
`get_*_schedule_with_warmup` factories, `total_steps` / `steps_per_epoch` of `OneCycleLR`,
`T_max` of `CosineAnnealingLR`, `total_iters` of `LinearLR` / `PolynomialLR`) back through the
names it reads, as bound where the scheduler is built, to the `len(loader)` calls it grows from,
and flags it (one finding, stating each reason) when:

- the loader came from `prepare(...)` before the `len` was read (a per-process count), the
  scheduler is later passed to `prepare`, and the length is not multiplied by the number of
  processes, with neither `split_batches=True` nor `step_scheduler_with_optimizer=False`;
- with K > 1, the `len(loader)` is not divided by K (or is multiplied back by it:
  `max_train_steps * K`) while the scheduler advances once per optimizer step (prepared and
  stepped in an `accumulate()` loop, or stepped on the update step).

Not flagged: lengths computed from the loader before `prepare` (global batches; the values the
HF examples recompute after `prepare` do not resize a scheduler already built), explicit step
counts from configuration (`args.max_steps`), unprepared schedulers stepped by hand in the step
branch and sized in per-process optimizer steps, and schedulers stepped on every micro-step (a
length in micro-batches, such as `len(dl) * epochs` or `max_steps * K`, matches that stepping;
one in optimizer steps is ACL305's finding).

## Why is this bad?
With `split_batches=False` (the default) a prepared scheduler steps W times per optimizer step,
because Accelerate expects its length in global batches, counted on the unprepared loader. Sized
from the prepared per-process loader, it runs W times too fast: warm-up is W times shorter and the
decay ends after 1/W of training. Sized in micro-batches instead of optimizer steps under
accumulation, it runs K times too slow and never reaches its end. The two errors can cancel or
compound.

## Example
```python
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup
accelerator = Accelerator(gradient_accumulation_steps=K)
model, opt, dl = accelerator.prepare(model, opt, dl)
sched = get_linear_schedule_with_warmup(opt, 500, len(dl) * epochs)   # per-process micro-batches
sched = accelerator.prepare(sched)          # stepped W times per update
```

## Use instead
```python
import math
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup
accelerator = Accelerator(gradient_accumulation_steps=K)
steps = math.ceil(len(dl) / K) * epochs     # dl not prepared yet: global batches
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
