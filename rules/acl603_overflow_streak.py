"""ACL603 overflow-streak: fp16 steps skipped one after another while the scale collapses."""

from rules._base import Rule

RULE = Rule(
    code="ACL603",
    name="overflow-streak",
    summary="a long streak of skipped fp16 steps: weights stop changing, the scale collapses",
    severity="error",
    fix="none",
    runtime="full",
    static=False,
    docs="""\
## What it does
Runtime only; the linter has no static check. The guard detects every skipped fp16 optimizer step,
fused and capturable optimizers included, and counts consecutive skips. Fused or capturable
optimizers combined with fp16 are where this matters most.

## Why is this bad?
In fp16 each overflow makes `scaler.step` skip the update and halves the scale. A few skips at the
start are normal calibration; a long streak means the forward or backward produces inf/NaN at any
scale. The loop keeps running and logging while the weights no longer change and the scale
collapses towards zero (after 40 consecutive skips, 65536·2^-40 ≈ 6e-8). With fused or capturable
optimizers the skip happens inside the kernel, so Accelerate's `step_was_skipped` reads false and
the scheduler advances on skipped steps.

## Example
```python
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
model, opt, sched = accelerator.prepare(model, opt, sched)     # mixed_precision="fp16"
accelerator.backward(loss); opt.step()
sched.step()                    # skip inside the fused kernel goes unseen: LR advances
```

## Use instead
```python
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
model, opt, sched = accelerator.prepare(model, opt, sched)     # mixed_precision="fp16"
before = accelerator.scaler.get_scale()
accelerator.backward(loss); opt.step()
if accelerator.scaler.get_scale() >= before: sched.step()     # no back-off: it stepped
```

## Fix safety
No autofix: the streak is only visible in a running program, and its cause (a NaN-producing
operation, a too-high learning rate) needs a human.

## At runtime
A step counts as skipped when `scaler.get_scale()` after `update()` is lower than before (which
works for fused optimizers and costs one sync), or when the optimizer's `found_inf_per_device`
values are non-zero between `step` and `update`. The guard raises ACL603 after a configurable
streak of skips or when the scale drops below 1, and the engine never steps the scheduler on a
skipped step.
""",
)
