"""ACL106 fp16-without-scaler: fp16 autocast training with no GradScaler."""

from rules._base import Rule

RULE = Rule(
    code="ACL106",
    name="fp16-without-scaler",
    summary="fp16 autocast without a GradScaler: small gradients underflow to zero",
    severity="error",
    fix="none",
    runtime="full",
    static=True,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Flags an enabled `torch.autocast` / `torch.amp.autocast` / `torch.cuda.amp.autocast` region whose
dtype is float16 (written, or omitted on a device other than a literal `"cpu"`), when a statement
of the region feeds a backward in the same function through a model that trains (not one frozen
with `requires_grad_(False)`), the region is not under `no_grad` / `inference_mode`, and nothing
scales the loss: no GradScaler in the module, none handed to the function, and no Accelerator or
guard engine other than one pinned to `mixed_precision="no"` (an fp16 engine scales itself; a raw
backward beside it is ACL101, a region of another dtype is ACL204).

Per configuration: when the region's dtype and the scaler's `enabled=` read the same settings
(`--dtype`, a global nanoGPT's configurator may override, the machine's bf16 support), the linter
evaluates them together and reports the runs that train fp16 with every scaler off, with the
setting that makes it real (`autocast()` without dtype beside `GradScaler(enabled=(dtype ==
'float16'))` is wrong `with dtype='bfloat16' or dtype='float32'`). A value it cannot evaluate is
never a finding.

## Why is this bad?
Gradients flowing back through fp16 activations are computed in fp16, whose smallest subnormal is
about 6e-8 (smallest normal about 6e-5). Anything smaller becomes zero, so layers quietly stop
learning while the loop runs without error. `torch.autocast("cuda")` without `dtype` means
float16, so users who meant bf16 get fp16 with no scaler (on CPU the default is bf16).

## Example
```python
import torch
for x, y in dl:
    with torch.autocast("cuda"):             # float16 by default
        loss = crit(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
```

## Use instead
```python
import torch
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.bfloat16):   # or fp16 plus a GradScaler
        loss = crit(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
```

## Fix safety
No autofix: bf16 and fp16 with a GradScaler are both valid cures, and which one fits depends on
the hardware.

## At runtime
While an fp16 autocast region is open, the guard tags the autograd nodes of fp16 module outputs;
a backward with no enabled scaler whose graph runs through a tagged node reports ACL106 before
autograd runs (an error in engine mode, a warning in raw loops). A frozen fp16 teacher, or an fp16
evaluation that is never backpropagated, is not reported.
""",
)
