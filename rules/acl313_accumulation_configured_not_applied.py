"""ACL313 accumulation-configured-not-applied: K used in step arithmetic but never accumulated."""

from rules._base import Rule

RULE = Rule(
    code="ACL313",
    name="accumulation-configured-not-applied",
    summary="an accumulation setting sizes the schedule or batch, but the loop never accumulates",
    severity="error",
    fix="none",
    runtime="none",
    static=True,
    docs="""\
## What it does
Flags the first read of K (`args.gradient_accumulation_steps`, `cfg["grad_accum"]`, `self.accum`,
a constant) in step, learning-rate or batch-size arithmetic when the module has a loop that
backpropagates and steps, no loop gates its step (no modulus, counter, micro-step loop or
`accumulate()`), no engine is configured to accumulate, and K is nowhere else applied: not given
to an Accelerator, guard engine, `TrainingArguments`, DeepSpeed config or any call the linter
cannot see into, not used as a modulus, comparison or `range`, not dividing a loss or gradients.
A K that is only printed or logged (also through a name read only by log calls) is not flagged.

## Why is this bad?
The setting is parsed and used to compute the effective batch size, the number of training steps
or the learning rate, but the loop steps on every micro-batch. The schedule is then K times too
short, or the learning rate is scaled for a batch that never exists.

## Example
```python
from transformers import get_linear_schedule_with_warmup
total_steps = len(dl) * epochs // args.gradient_accumulation_steps
sched = get_linear_schedule_with_warmup(opt, 100, total_steps)
for batch in dl:
    loss = model(**batch).loss
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
```

## Use instead
```python
import math
from transformers import get_linear_schedule_with_warmup
# either accumulate for real (shown), or drop K from the step and batch arithmetic
K = args.gradient_accumulation_steps
total_steps = math.ceil(len(dl) / K) * epochs
sched = get_linear_schedule_with_warmup(opt, 100, total_steps)
for i, batch in enumerate(dl):
    (model(**batch).loss / K).backward()
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step(); sched.step(); opt.zero_grad()
```

## Fix safety
No autofix: whether to start accumulating or to drop K from the arithmetic is the user's choice.
""",
)
