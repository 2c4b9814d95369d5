"""ACL306 accumulate-context-missing: accumulation configured but `accumulate()` never entered."""

from rules._base import Rule

RULE = Rule(
    code="ACL306",
    name="accumulate-context-missing",
    summary="accumulation configured but `accumulate()` never entered: a 1/N step on every batch",
    severity="error",
    fix="unsafe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags a batch loop that calls `accelerator.backward(...)` (or a raw `.backward()` on a loss from a
prepared model, which ACL101 also reports) without entering `accelerator.accumulate(...)`, directly
or through a same-module helper, when the Accelerator is given `gradient_accumulation_steps=` other
than literal 1 or a `GradientAccumulationPlugin`.

## Why is this bad?
`accelerator.backward` divides every loss by N, but only `accumulate()` advances the micro-step
counter. Without it `sync_gradients` stays true, so the optimizer steps on every batch with 1/N of
the true gradient. Nothing is accumulated, SGD's effective learning rate is divided by N, and the
run takes N times more optimizer steps than its schedule was sized for.

## Example
```python
accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    accelerator.backward(model(**batch).loss)     # /4, stepped every batch
    opt.step(); opt.zero_grad()
```

## Use instead
```python
accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. The loop body, from the forward to the optimizer calls, is wrapped in
`with accelerator.accumulate(<models passed to prepare>):`. The number of optimizer steps then
drops N-fold, which changes scheduler progress and any logging, evaluation or checkpoint cadence
keyed on iterations.

## At runtime
The engine counts micro-steps; with N > 1, the first backward outside any accumulate window raises
ACL306.
""",
)
