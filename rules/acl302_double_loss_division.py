"""ACL302 double-loss-division: dividing by N by hand before a backward that divides by N."""

from rules._base import Rule

RULE = Rule(
    code="ACL302",
    name="double-loss-division",
    summary="manual `/ N` before an engine backward that divides again: gradients N× too small",
    severity="error",
    fix="safe",
    runtime="heuristic",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags the argument of `accelerator.backward`, `engine.backward` or a DeepSpeed engine's
`.backward` when it is divided by K (`/`, `/=`, or `* (1 / K)`), K being the value given to the
engine, `accelerator.gradient_accumulation_steps`, or an accumulation-named expression while
K > 1 is configured.

## Why is this bad?
Those backward calls already divide by N. Dividing by hand as well weights each micro-batch by
1/N², so gradients are N times too small: with SGD the learning rate is effectively divided by N;
with Adam mostly `eps` and clipping change (a fixed `max_norm` becomes N times looser). A loss
logged after the division also reads N times too small.

## Example
```python
accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
with accelerator.accumulate(model):
    loss = model(**batch).loss / args.grad_accum
    accelerator.backward(loss)              # divides again
```

## Use instead
```python
accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
with accelerator.accumulate(model):
    loss = model(**batch).loss
    accelerator.backward(loss)              # the only division
```

## Fix safety
Safe. The division is removed only when the divided value feeds nothing but the backward call
(written inline, or a name used once), so no other computation or log line changes. Otherwise the
rule reports without a fix.

## At runtime
Heuristic: `engine.backward` looks at `loss.grad_fn`, and a root division by N (or multiplication
by 1/N) gives an ACL302 warning. It is not an error, because a divisor can equal N by coincidence.
""",
)
