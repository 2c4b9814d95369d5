"""ACL102 scaler-step-bypass: `opt.step()` on gradients that a GradScaler has scaled."""

from rules._base import Rule

RULE = Rule(
    code="ACL102",
    name="scaler-step-bypass",
    summary="`opt.step()` after `scaler.scale(loss).backward()` applies S-times scaled gradients",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags `opt.step()` fed by a backward of `scaler.scale(loss)` (directly, through a name bound to
it, or in `torch.autograd.backward`) in a loop, in a per-batch method of a trainer class, or in a
scaler wrapper function (`__call__` of a timm-style class), when nothing in that loop steps that
optimizer through the scaler (`scaler.step(opt)`, itself or in a function of the module it
calls). A scaled backward inside a function of the module that the loop calls
(`self.training_step(batch)`) counts. Not flagged: prepared optimizers (Accelerate, the guard
engine), instances of a module class whose own `step()` goes through a scaler, scalers built with
a literal `enabled=False`, an optimizer whose last backward before the step is unscaled, or one
built from other models than the scaled loss comes from (a second, fp32 model).

## Why is this bad?
After `scaler.scale(loss).backward()` every `.grad` holds S times the true gradient. A plain
`opt.step()` applies it as is, so the update is S times too large (65536 with the default initial
scale), steps with inf/NaN gradients are not skipped, and the scale never adapts.

## Example
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    opt.step()                      # applies S * g
    opt.zero_grad()
```

## Use instead
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)                # unscales, skips inf/nan steps
    scaler.update()
    opt.zero_grad()
```

## Fix safety
Safe. `opt.step()` becomes `scaler.step(opt)`, and if the loop has no `scaler.update()`, one is
inserted after the iteration's last `scaler.step(...)` (the same place ACL103 would put it, so
both fixes together add one update). No fix for `opt.step(closure)`: the scaler does not support
closures; none either when another function updates a scaler of that name (a caller, once per
epoch), since a second update with no step in between raises. This is exactly the step the scaler
protocol requires. Prepared optimizers are never flagged: they call the scaler themselves.

## At runtime
The guard wraps `scaler.scale` to note a pending scaled backward, and wraps the inner optimizer's
`step`. A step while a scaled backward is pending, outside `scaler.step`, raises ACL102 before
any parameter changes.
""",
)
