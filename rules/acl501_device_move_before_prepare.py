"""ACL501 device-move-before-prepare: moving a model to a hard-coded GPU before `prepare`."""

from rules._base import Rule

RULE = Rule(
    code="ACL501",
    name="device-move-before-prepare",
    summary="`.cuda()` / `.to('cuda')` before `prepare` puts every rank's model on GPU 0",
    severity="warning",
    fix="safe",
    runtime="full",
    static=True,
    hint=(
        "a model never passed to `prepare` moved to a fixed CUDA device (style: "
        "`accelerator.device` says where it goes)."
    ),
    docs="""\
## What it does
Flags `.cuda()`, `.cuda(0)`, `.to("cuda")`, `.to("cuda:0")`, `.to(torch.device("cuda"))`, or
`.to(device)` with `device` bound to such a literal (or to `"cuda" if ... else "cpu"`), applied to
a model before that model is passed to `accelerator.prepare` in the same function: in the model's
assignment chain (`model = Net().cuda()`) or as its own statement (`model.cuda()`). Devices from
`accelerator.device` or `LOCAL_RANK`, dtype-only moves and `Accelerator(device_placement=False)`
are left alone. A model that is never passed to `prepare` (a frozen VAE, a teacher: built by a
class or `from_pretrained`) and is moved to a fixed CUDA device gets a hint (severity `info`, no
fix): it still needs a placement, and `.to(accelerator.device)` is the rank's own.

## Why is this bad?
Before the engine places the model, `"cuda"` means `cuda:0` on every rank, so all processes first
load a full copy onto GPU 0 (out of memory, or heavy contention), and under FSDP/ZeRO the whole
unsharded model is materialised before sharding. On XLA, Accelerate rejects a model and optimizer
on different devices. The move is redundant anyway: `prepare` places the model on
`accelerator.device`. It is a warning because a single-GPU run is unaffected.

## Example
```python
import torch
from accelerate import Accelerator
model = Net().cuda()                        # every rank -> cuda:0
opt = torch.optim.AdamW(model.parameters())
accelerator = Accelerator()
model, opt = accelerator.prepare(model, opt)
```

## Use instead
```python
import torch
from accelerate import Accelerator
model = Net()                               # prepare() moves it to accelerator.device
opt = torch.optim.AdamW(model.parameters())
accelerator = Accelerator()
model, opt = accelerator.prepare(model, opt)
```

## Fix safety
Safe. The device move is removed (`.cuda()` is dropped; `.to("cuda", dtype)` becomes
`.to(dtype)`), only when nothing between the move and `prepare` depends on the model's device (no
forward call, no tensor created on its parameters' device); `prepare` then does the placement.

## At runtime
At `prepare`, a parameter on a device other than the engine's (such as `cuda:0` on local rank 1),
or optimizer parameters that are not the model's own parameter objects, raises ACL501.
""",
)
