"""ACL204 autocast-dtype-conflict: a user autocast dtype that disagrees with the engine's."""

from rules._base import Rule

RULE = Rule(
    code="ACL204",
    name="autocast-dtype-conflict",
    summary="a user autocast dtype differs from the engine's precision (or autocasts nothing)",
    severity="error",
    fix="none",
    runtime="full",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags an enabled user autocast whose dtype (written, or the device default: fp16 on CUDA, bf16 on
CPU) is fp16 while every Accelerator / guard engine of the module is statically set to bf16, or
the reverse; and `accelerator.autocast()` in a module whose engines are pinned to
`mixed_precision="no"` (a guard engine built without a precision is `"no"`). A dtype or device
taken from a variable, and a precision read from a config file or the CLI are left alone, except
where the flag's `choices=` name the precisions: then each choice is judged, and a training region
that disagrees with one is reported with it (`with --mixed_precision bf16 (default no)`); a
region no backward follows (validation, the inference after training) is not. Never compared:
a region none of whose values reach a backward of its function (validation images made inside
the epoch loop, a frozen helper's output cut by `.detach()`, `.item()` or a cast to `uint8`),
and a CPU region beside an engine on the GPU (it changes CPU ops only; a bf16 engine pinned to
the CPU with `cpu=True` is compared). A region around the prepared model is reported by ACL201
too, whose fix adopts the engine's dtype.

## Why is this bad?
With an engine in bf16, a bare `torch.autocast("cuda")` runs its region in fp16 with no scaler, so
small gradients underflow (as in ACL106), and mixing Half and BFloat16 tensors fails in operations
that autocast does not cover. With the engine's precision at `"no"` (or silently fp32, see
ACL602), `accelerator.autocast()` does nothing, and code the user believes is mixed precision runs
in fp32.

## Example
```python
import torch
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="bf16")
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, y in dl:
    logits = model(x)
    with torch.autocast("cuda"):                      # float16 by default
        aux = kl_term(logits, teacher(x))
    accelerator.backward(crit(logits, y) + aux)
    opt.step(); opt.zero_grad()
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="bf16")
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, y in dl:
    logits = model(x)
    with accelerator.autocast():                      # same dtype as the engine
        aux = kl_term(logits, teacher(x))
    accelerator.backward(crit(logits, y) + aux)
    opt.step(); opt.zero_grad()
```

## Fix safety
No autofix: which dtype was intended is unclear. Where the region wraps a prepared model, ACL201's
fix (switching to `accelerator.autocast()`) resolves both.

## At runtime
In forward pre-hooks and on entry to `engine.autocast()`, whenever autocast is enabled, the active
autocast dtype must equal the engine's; a mismatch reports ACL204. Entering `engine.autocast()`
while the effective precision is fp32 gives a warning.
""",
)
