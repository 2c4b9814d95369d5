"""ACL108 unprepared-object-used: stepping the original optimizer or scheduler after `prepare`."""

from rules._base import Rule

RULE = Rule(
    code="ACL108",
    name="unprepared-object-used",
    summary="the original optimizer or scheduler is stepped after `prepare` returned a wrapper",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags `.step()` / `.zero_grad()` on an optimizer or scheduler that was passed to `prepare(...)`
while the matching return value was bound to a different name, after that call: on the same
name later in the function, in a function that reads it from the module, in another method of
the class (`self.optimizer` stepped while `self.opt` holds the wrapper), or through a helper's
parameter when the caller passes the original. The calls on one original object in one function
are one finding. It also reports, without a fix, a scheduler built in the module that no
`prepare` call received but that is stepped inside an `accumulate()` block with K > 1 (unless the
step is gated on `sync_gradients`, or the schedule's length is counted in micro-batches, such as
`max_steps * gradient_accumulation_steps`). Reading the original (`opt.param_groups`,
`opt.state_dict()`), using it before the prepare, and epoch-level schedulers are left alone.

## Why is this bad?
The objects returned by `prepare` do the gating: they step and zero only on update steps, go through
`scaler.step` and `update` in fp16, and step the scheduler only after a real optimizer step. The
original optimizer's `step()` skips all that: it updates on every micro-batch from a partial sum
and, in fp16, applies S-times scaled gradients with no inf check. The original scheduler's
`step()` advances on every micro-batch, compressing the schedule K-fold.

## Example
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, p_opt, dl, p_sched = accelerator.prepare(model, opt, dl, sched)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step(); sched.step(); opt.zero_grad()    # original objects
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, p_opt, dl, p_sched = accelerator.prepare(model, opt, dl, sched)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        p_opt.step(); p_sched.step(); p_opt.zero_grad()
```

## Fix safety
Safe. The receiver is replaced by the prepared name (`opt.step()` becomes `p_opt.step()`), only
where that name is in scope at the call; for a helper, the argument at the call site is
replaced (`train(model, opt)` becomes `train(model, p_opt)`). The wrapper drives the same inner
object. No fix when the wrapper was discarded (`_`) or is out of reach. A scheduler that was
never prepared gets no fix: adding it to `prepare` would also change how often it steps (ACL310).

## At runtime
At `prepare` the guard patches the inner optimizer's and scheduler's `step`; a call that does not
come through the engine's wrapper raises ACL108. At each update step it also compares
`scheduler.last_epoch` with the engine's optimizer-step count.
""",
)
