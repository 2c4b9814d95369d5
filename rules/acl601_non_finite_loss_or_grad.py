"""ACL601 non-finite-loss-or-grad: a NaN/Inf loss or gradient about to reach the optimizer."""

from rules._base import Rule

RULE = Rule(
    code="ACL601",
    name="non-finite-loss-or-grad",
    summary="a non-finite loss or gradient is about to corrupt every weight it touches",
    severity="error",
    fix="none",
    runtime="full",
    static=False,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Runtime only; the linter has no static check. The guard checks that each loss given to
`engine.backward` is finite and, before the optimizer runs without an active scaler, that the total
gradient norm is finite.

## Why is this bad?
One NaN or Inf in the loss or a gradient goes through the optimizer into every weight it touches
(and into Adam's moment estimates), and the run is corrupted for good. In fp32 and bf16 nothing
skips such a step. In fp16 the scaler does skip it, but a loss that was non-finite before scaling
is a real bug rather than an overflow, and it leads to ACL603.

## Example
```python
loss = crit(model(x), y)
loss.backward()
opt.step()                                  # one nan reaches every weight
```

## Use instead
```python
loss = crit(model(x), y)
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
opt.step()
```

## Fix safety
No autofix: non-finite values appear only in a running program, and the cure depends on where they
come from.

## At runtime
`engine.backward` records whether the loss is finite as a device-side flag that is read at the sync
step, so there is no host sync per micro-step. At the update step, before the optimizer runs and
when no scaler is active, the total gradient norm (computed anyway for clipping) is checked for
inf/NaN. In fp16 a non-finite unscaled loss is reported apart from scaler overflows (a NaN that
enters the loss only through scaled gradients, as in the gradient-penalty recipe, is an overflow).
By default the guard raises; a configurable policy skips the step and clears the gradients
instead. With `ACCEL_GUARD_ANOMALY=1` (or `guard.configure(anomaly=1)`), autograd's anomaly mode
is on from the first finding, so the next backward that produces a NaN names the operation.
""",
)
