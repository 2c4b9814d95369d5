"""ACL303 per-microstep-clipping: clipping or unscaling on micro-steps that do not step."""

from rules._base import Rule

RULE = Rule(
    code="ACL303",
    name="per-microstep-clipping",
    summary="gradient clipping or unscaling runs on every micro-step instead of only before the "
    "optimizer step",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags a clip or unscale call (`accelerator.clip_grad_norm_` / `clip_grad_value_`,
`torch.nn.utils.clip_grad_*`, `fabric.clip_gradients`, `scaler.unscale_`,
`accelerator.unscale_gradients`) inside
`with accelerator.accumulate(...)` that is not guarded by `if accelerator.sync_gradients` (or the
engine's equivalent), or in a manual accumulation loop outside the condition that gates
`opt.step()`. A gate may also be a name bound to the condition (`sync =
accelerator.sync_gradients`) or a conditional expression (`clip(...) if
accelerator.sync_gradients else None`). A per-batch function (`train_step`) is judged by the
step gate of the loop that calls it. A condition on another cadence (`step % logging_steps == 0`)
is not a gate: only a modulus that is the accumulation value counts. Adjacent flagged calls of
one block (`scaler.unscale_(opt)` then `clip_grad_norm_(...)`, or a clip in each branch of one
`if`) are one misplaced block: one finding, spanning them, with one fix.

## Why is this bad?
On a micro-step that does not step, `.grad` holds a partial sum. In fp16 every clip needs an
unscale, and a second `unscale_` before `update()` raises `RuntimeError`, so the run crashes on
the second micro-step. In bf16/fp32 the partial sums are clipped, and since clipping is not linear
(clip(a) + b differs from clip(a + b)) the final gradient is silently wrong. Under FSDP/XLA every
extra clip also costs a norm reduction.

## Example
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
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
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step(); opt.zero_grad()
```

## Fix safety
Safe. The statement is wrapped in `if accelerator.sync_gradients:` (Accelerate / engine) or in the
loop's step condition (manual loops, only when that condition has no side effects and can be
evaluated twice). No fix when the statement binds a name, such as `grad_norm = ...`, that is read
outside the new block.

## At runtime
`engine.clip_grad_norm_`, the patched torch clip functions and `scaler.unscale_` check the engine's
micro-step counter; a call on a non-sync micro-step raises ACL303 before torch's second-unscale
error can occur.
""",
)
