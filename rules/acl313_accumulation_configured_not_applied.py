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
Flags a name matching the accumulation pattern (`gradient_accumulation_steps`, `grad_accum`, ...)
that is read in step, learning-rate or batch-size arithmetic while no loop that backpropagates
gates its optimizer step on it, divides by it, or hands it to an Accelerator or engine.

## Why is this bad?
The setting is parsed and used to compute the effective batch size, the number of training steps
or the learning rate, but the loop steps on every micro-batch. The schedule is then N times too
short, or the learning rate is scaled for a batch that never exists.

## Example
```python
total_steps = len(dl) * epochs // args.gradient_accumulation_steps
sched = get_linear_schedule_with_warmup(opt, 100, total_steps)
for batch in dl:
    loss = model(**batch).loss
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
```

## Use instead
```python
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
