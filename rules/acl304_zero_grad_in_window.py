"""ACL304 zero-grad-in-window: `zero_grad()` that discards micro-batches of the current window."""

from rules._base import Rule

RULE = Rule(
    code="ACL304",
    name="zero-grad-in-window",
    summary="`zero_grad()` inside the accumulation window wipes the micro-batches gathered so far",
    severity="error",
    fix="unsafe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags `opt.zero_grad()` / `model.zero_grad()` that runs unconditionally on every micro-step of a
manual accumulation loop (the optimizer step is gated by `% K`, by a counter compared with K, or
comes after a `for micro_step in range(K)` loop that runs the backward), or that comes before the
backward inside an `accumulate()` block of an engine configured with more than one accumulation
step. A zero_grad under any test (the step condition, a window start such as `if i % K == 0:`, a
check for non-finite gradients) is left alone. A per-batch function (`train_step`) is judged by
the step gate of the loop that calls it, and reported without a fix (the step is elsewhere).

## Why is this bad?
Zeroing inside the window throws away what has been accumulated. A manual loop that zeroes every
iteration keeps only the last micro-batch, and with loss / K the step uses 1/K of its gradient:
the effective batch is one micro-batch and SGD's learning rate shrinks to 1/K. Under Accelerate
the prepared `zero_grad()` only acts on update steps, but the sync flag is already set when the last
micro-step's block is entered, so a `zero_grad()` at the top of the block wipes the K - 1 earlier
micro-batches all the same.

## Example
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        opt.zero_grad()                 # wipes the window on the update step
        accelerator.backward(model(**batch).loss)
        opt.step()
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step()
        opt.zero_grad()
```

## Fix safety
Unsafe. The call is moved to just after the optimizer step, in the same branch or block. Gradients
that exist before the loop (a sanity-check backward, restored state) then leak into the first
window, and paths that skip the step (such as `continue` on a bad batch) now carry their gradients
into the next window.

## At runtime
The guard wraps `zero_grad`: a call while the window holds 1 to K - 1 completed micro-steps whose
gradients no step has consumed (counted per parameter with `register_post_accumulate_grad_hook`)
raises ACL304, unless those gradients hold inf/NaN (dropping a poisoned window is deliberate).
""",
)
