"""ACL306 accumulate-context-missing: accumulation configured but `accumulate()` never entered."""

from rules._base import Rule

RULE = Rule(
    code="ACL306",
    name="accumulate-context-missing",
    summary="accumulation configured but `accumulate()` never entered: a 1/K step on every batch",
    severity="error",
    fix="unsafe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags the first backward of a loop that calls `accelerator.backward(...)` / `engine.backward(...)`
(or a raw `.backward()` of a loss computed by a prepared model, which ACL101 also reports) outside
any `accumulate(...)` block, when that engine is configured with `gradient_accumulation_steps=`
other than a literal 1 (or a `GradientAccumulationPlugin` with such `num_steps`). Not flagged: no
accumulation in code, or a configuration the linter cannot read (`**kwargs`); a backward inside a
block in its own function or in a caller that calls it from one; a loop that calls a training-step
helper entering `accumulate()`; a loop that gates its optimizer step on K itself.

## Why is this bad?
`accelerator.backward` divides every loss by K, but only `accumulate()` advances the micro-step
counter. Without it `sync_gradients` stays true, so the optimizer steps on every batch with 1/K of
the true gradient. Nothing is accumulated, SGD's effective learning rate is divided by K, and the
run takes K times more optimizer steps than its schedule was sized for.

## Example
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    accelerator.backward(model(**batch).loss)     # /4, stepped every batch
    opt.step(); opt.zero_grad()
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. The loop body, from the statement that runs the loss's model to the last optimizer,
scheduler or clipping call, is wrapped in `with <engine>.accumulate(<prepared models of the
loss>):`. The number of optimizer steps then drops K-fold, which changes scheduler progress and any
logging, evaluation or checkpoint cadence keyed on iterations. No fix when the backward is in a
per-batch function, when no prepared model of the loss is visible, or when re-indenting would change
a multi-line string.

## At runtime
The engine counts micro-steps; with K > 1, the first backward outside any accumulate window raises
ACL306.
""",
)
