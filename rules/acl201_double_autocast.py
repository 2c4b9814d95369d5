"""ACL201 double-autocast: a user autocast region around a prepared model, or nested in another."""

from rules._base import Rule

RULE = Rule(
    code="ACL201",
    name="double-autocast",
    summary="user autocast around a prepared model (or inside another region) runs loss code in "
    "low precision",
    severity="error",
    fix="unsafe",
    runtime="partial",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags a `torch.autocast(...)` / `torch.amp.autocast(...)` / `torch.cuda.amp.autocast(...)` region
that encloses a call of a model prepared by an Accelerator or guard engine whose precision is
statically fp16 or bf16, and an enabled autocast region nested lexically inside another enabled one.

## Why is this bad?
A prepared model already runs its forward under the engine's autocast and hands back fp32 outputs,
so that the loss is computed in fp32. Wrapping the call in a second region changes nothing inside
the model, but everything else in the region (loss, auxiliary heads, metrics) now runs in fp16 or
bf16, which defeats the fp32-output design: a custom loss using `exp` or a matmul can overflow in
fp16. Two nested user regions are just as confusing: the inner one wins, so either it is dead code
or it switches dtype halfway through a computation.

## Example
```python
import torch
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="fp16")
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = info_nce(model(x), temperature=0.05)     # loss math in fp16
    accelerator.backward(loss)
    opt.step(); opt.zero_grad()
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="fp16")
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, y in dl:
    loss = info_nce(model(x), temperature=0.05)         # fp32 outputs, fp32 loss
    accelerator.backward(loss)
    opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. For nested user regions the inner `with` is removed and its body dedented; for a region
around a prepared model, `torch.autocast(...)` is replaced by `accelerator.autocast()`, so the
region follows the engine's precision. Both edits change which operations run in low precision,
and the replacement takes the engine's dtype, which may not be the one the user wrote.

## At runtime
The prepared model's forward pre-hook runs before the engine enters its own autocast; if
`torch.is_autocast_enabled(dev)` is already true there, the guard reports ACL201 with the ambient
`torch.get_autocast_dtype(dev)`. A dtype different from the engine's is reported as ACL204.
Nested user regions that do not wrap a prepared model are visible only to the linter.
""",
)
