"""ACL105 scaler-with-bf16: a GradScaler in a bf16 training setup."""

from rules._base import Rule

RULE = Rule(
    code="ACL105",
    name="scaler-with-bf16",
    summary="a GradScaler under bf16 gains nothing, can hide real infs and crashes on bf16 params",
    severity="warning",
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

Per configuration: where the scaler's `enabled=`, the autocast dtype and the Accelerator's
`mixed_precision` read the same settings, they are evaluated together, and a scaler that is on in
a run whose precision is bf16 is reported with that setting (`enabled=(dtype in ['float16',
'bfloat16'])` `with dtype='bfloat16'`; `enabled=args.mixed_precision != "no"` beside
`Accelerator(mixed_precision=args.mixed_precision)` `with --mixed_precision bf16`), without a fix:
under fp16 the scaler is needed.

It is a warning when the trained parameters are fp32 (the usual autocast setup: wasted work, the
results are right), and an error when the file trains a model cast to bf16 (`.bfloat16()`,
`.to(torch.bfloat16)`, `torch_dtype=torch.bfloat16`, parameters reaching an optimizer, not
frozen) with a CUDA scaler, where `unscale_` fails.

## Why is this bad?
bf16 has the exponent range of fp32: its gradients do not underflow, so loss scaling gains
nothing. The scaler still costs an inf check and a host sync every step, and can silently skip
steps that hold a genuine inf (hiding a real bug). With bf16 parameters the gradients are bf16
too, and torch's CUDA unscale kernel (`_amp_foreach_non_finite_check_and_unscale_cuda`) is not
implemented for BFloat16, so the first `unscale_` or `step` raises (the CPU kernel accepts
bf16).

## Example
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
```

## Use instead
```python
import torch
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = crit(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. The scaler construction is deleted and its uses rewritten: `scaler.scale(loss).backward()`
becomes `loss.backward()`, `scaler.step(opt)` becomes `opt.step()`, and `scaler.update()` /
`scaler.unscale_(opt)` are removed. Checkpoint code that saves or loads `scaler.state_dict()` then
breaks, and a run that relied on the scaler to skip non-finite steps now applies them (see
ACL601).

## At runtime
The engine refuses a scaler when its precision is bf16 (an error). For a user scaler, the guard
warns at `scaler.scale` when the last forward ran under bf16 autocast, and at `unscale_` /
`scaler.step` when trainable parameters are bf16.
""",
)
