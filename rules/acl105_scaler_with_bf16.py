"""ACL105 scaler-with-bf16: a GradScaler in a bf16 training setup."""

from rules._base import Rule

RULE = Rule(
    code="ACL105",
    name="scaler-with-bf16",
    summary="a GradScaler under bf16 gains nothing, can hide real infs and crashes on bf16 params",
    severity="error",
    fix="unsafe",
    runtime="full",
    static=True,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Flags a `GradScaler(...)` that is on whenever the run is bf16 (built without `enabled=`, with
`enabled=True`, or switched by the same expression as a bf16 autocast region) in a module whose
only low precision is bf16: a bf16 autocast region (`dtype=torch.bfloat16`, or `"cpu"` with no
dtype) or an Accelerator / guard engine with `mixed_precision="bf16"`, and no fp16 path anywhere
(no autocast that may be fp16, no fp16 or unknown-precision engine, no `torch.float16`,
`.half()`, `args.fp16` or `"fp16"` choice). A scaler whose `enabled=` follows the fp16 choice, or
is switched by something else (`torch.cuda.is_available()`), is left alone.

## Why is this bad?
bf16 has the exponent range of fp32: its gradients do not underflow, so loss scaling gains
nothing. The scaler still costs an inf check and a host sync every step, can silently skip steps
that hold a genuine inf (hiding a real bug), and with bf16 parameters it crashes at the first step
because the unscale kernel is not implemented for BFloat16.

## Example
```python
scaler = torch.amp.GradScaler("cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = crit(model(x), y)
scaler.scale(loss).backward()
scaler.step(opt); scaler.update()
```

## Use instead
```python
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = crit(model(x), y)
loss.backward()
opt.step()
```

## Fix safety
Unsafe. The scaler construction is deleted and its uses rewritten: `scaler.scale(loss).backward()`
becomes `loss.backward()`, `scaler.step(opt)` becomes `opt.step()`, and `scaler.update()` /
`scaler.unscale_(opt)` are removed. Checkpoint code that saves or loads `scaler.state_dict()` then
breaks, and a run that relied on the scaler to skip non-finite steps now applies them (see
ACL601).

## At runtime
The engine refuses to create a scaler when its precision is bf16. For a user scaler, the guard
checks at `scaler.scale` / `scaler.step` whether the last forward ran under bf16 autocast or
whether trainable parameters are bf16, and reports ACL105.
""",
)
