"""ACL101 raw-backward: a plain `loss.backward()` where an engine or scaler owns the backward."""

from rules._base import Rule

RULE = Rule(
    code="ACL101",
    name="raw-backward",
    summary="`loss.backward()` bypasses the engine's 1/K division and fp16 loss scaling",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags `loss.backward()` (and `torch.autograd.backward(loss)`) in a training loop whose backward
belongs to an Accelerator / guard engine, or to an enabled `GradScaler` that the same loop steps
(itself, or through a function of the module such as `def step(): scaler.step(opt)`). Where the
engine's precision is pinned to something other than fp16 and no accumulation is configured (or
the loss is divided by K by hand), the raw backward computes what the engine's would except under
a DeepSpeed or Megatron-LM launch, whose engine runs the backward: that finding is latent (a
warning that says so).

## Why is this bad?
`accelerator.backward(loss)` divides the loss by the accumulation steps K and, in fp16, scales it.
A raw `loss.backward()` skips both: accumulated gradients are K times too large, and under fp16 the
first `scaler.step` fails on `_scale is None`, or (when only some backward calls are scaled) the
unscaled contributions are divided by the loss scale and effectively vanish.

## Example
```python
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        loss.backward()                 # no 1/4, no loss scale
        opt.step(); opt.zero_grad()
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        opt.step(); opt.zero_grad()
```

## Fix safety
Safe. `loss.backward(**kw)` becomes `accelerator.backward(loss, **kw)` (or `engine.backward`), or
`scaler.scale(loss).backward(**kw)` in a raw AMP loop. A manual division by K on the argument is
removed by the same edit, so the result does not trigger ACL302. No fix for a list of losses
(`torch.autograd.backward([l1, l2])` or a name bound to one). Unsafe where the engine is
configured for K > 1 but the loop never enters `accumulate()` (ACL306) and the loss is not
divided by K by hand: the engine's backward divides by K while the optimizer still steps on
every batch, so this edit alone would make every update K times smaller; with ACL306's fix the
pair gives the accumulate loop.

## At runtime
`engine.backward` marks the backward it owns, and a hook on every grad-requiring output of a
prepared model raises ACL101 when a backward reaches it unmarked. In raw scaler loops, a scaler
that was never given a loss (`_scale is None`) at the first `step` / `unscale_` is reported as
ACL101 before torch's assertion.
""",
)
