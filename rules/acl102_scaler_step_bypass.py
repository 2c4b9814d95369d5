"""ACL102 scaler-step-bypass: `opt.step()` on gradients that a GradScaler has scaled."""

from rules._base import Rule

RULE = Rule(
    code="ACL102",
    name="scaler-step-bypass",
    summary="`opt.step()` after `scaler.scale(loss).backward()` applies S-times scaled gradients",
    severity="error",
    fix="safe",
    runtime="full",
    static=False,
    docs="""\
## What it does
Flags a loop in which `scaler.scale(...)` feeds a backward and an optimizer's `.step()` is called
directly, with no `scaler.step(<that optimizer>)` in the loop.

## Why is this bad?
After `scaler.scale(loss).backward()` every `.grad` holds S times the true gradient. A plain
`opt.step()` applies it as is, so the update is S times too large (65536 with the default initial
scale), steps with inf/NaN gradients are not skipped, and the scale never adapts.

## Example
```python
scaler.scale(loss).backward()
opt.step()                      # applies S * g
opt.zero_grad()
```

## Use instead
```python
scaler.scale(loss).backward()
scaler.step(opt)                # unscales, skips inf/nan steps
scaler.update()
opt.zero_grad()
```

## Fix safety
Safe. `opt.step()` becomes `scaler.step(opt)`, and if the loop has no `scaler.update()`, one is
inserted after the iteration's last `scaler.step(...)`. This is exactly the step the scaler
protocol requires. Prepared optimizers are never flagged: they call the scaler themselves.

## At runtime
The guard wraps `scaler.scale` to note a pending scaled backward, and wraps the inner optimizer's
`step`. A step while a scaled backward is pending, outside `scaler.step`, raises ACL102 before
any parameter changes.
""",
)
