"""ACL302 double-loss-division: dividing by K by hand before a backward that divides by K."""

from rules._base import Rule

RULE = Rule(
    code="ACL302",
    name="double-loss-division",
    summary="manual `/ K` before an engine backward that divides again: gradients K× too small",
    severity="error",
    fix="safe",
    runtime="heuristic",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags `accelerator.backward(X)`, the guard's `engine.backward(X)` and a DeepSpeed engine's
`.backward(X)` when the dataflow of X divides it by K on the way (`/`, `/=`, `* (1 / K)`). K is
the engine's own `gradient_accumulation_steps` (always), or, while the engine is configured to
accumulate (K given and not a literal 1, also through a `GradientAccumulationPlugin` or a DeepSpeed
config dict), the value it was given or an expression that spells it: `args.grad_accum`,
`self.accum`, `cfg["grad_accum"]`, a constant, or a name bound to one. Not flagged: an engine with
no accumulation in code (the manual division is then the only one), token or item counts
(`num_items_in_batch`), a path that multiplies K back (`loss * K * W / n_items`), a divided copy
used only for logging, a division in a branch that does not reach this backward, and the backward
of Fabric and Lightning's `manual_backward`, which do not divide.

## Why is this bad?
Those backward calls already divide by K. Dividing by hand as well weights each micro-batch by
1/K², so gradients are K times too small: with SGD the learning rate is effectively divided by K;
with Adam mostly `eps` and clipping change (a fixed `max_norm` becomes K times looser). A loss
logged after the division also reads K times too small.

## Example
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / args.grad_accum
        accelerator.backward(loss)              # divides again
        opt.step(); opt.zero_grad()
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)              # the only division
        opt.step(); opt.zero_grad()
```

## Fix safety
Safe. The division is removed only when the divided value feeds nothing but the backward call:
written inline (`accelerator.backward(loss / K)`), or a name read by nothing else
(`loss = out.loss / K` keeps `loss = out.loss`; `loss /= K` goes). Otherwise the rule reports
without a fix and names the line to edit. ACL101's fix judges a division by K the same way, so a
raw backward of a divided loss is fixed with the division removed exactly once.

## At runtime
Heuristic: `engine.backward` looks at `loss.grad_fn`, and a root division by K (or multiplication
by 1/K) gives an ACL302 warning. It is not an error, because a divisor can equal K by coincidence.
""",
)
