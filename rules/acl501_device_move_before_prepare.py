"""ACL501 device-move-before-prepare: a model moved to a device that is GPU 0 on every rank."""

from rules._base import Rule

RULE = Rule(
    code="ACL501",
    name="device-move-before-prepare",
    summary="`.to('cuda:0')`, or `.cuda()` before the Accelerator exists, puts every rank on GPU 0",
    severity="warning",
    fix="safe",
    runtime="full",
    static=True,
    hint=(
        'a model never passed to `prepare` moved to a bare `"cuda"` after the Accelerator '
        "exists (the rank's own GPU; style: `accelerator.device` says where it goes)."
    ),
    docs="""\
## What it does
Flags a move of a model to a device that is GPU 0 on every rank, applied before that model is
passed to `accelerator.prepare` in the same function (in its assignment chain, `model =
Net().cuda()`, or as its own statement, `model.cuda()`):

- a fixed index (`.cuda(0)`, `.to("cuda:0")`, `.to(torch.device("cuda", 0))`), whether or not the
  Accelerator exists yet;
- a bare CUDA device (`.cuda()`, `.to("cuda")`, `.to(torch.device("cuda"))`, or `.to(device)`
  with `device` bound to such a literal or to `"cuda" if ... else "cpu"`) that runs before the
  Accelerator, guard engine, accelerate state or `torch.cuda.set_device` exists, in program
  order across the module's own calls (an Accelerator made in `main()` before it calls
  `train(...)` comes first; so does one passed in, or one built in the class's `__init__`).

A model never passed to `prepare` (a frozen VAE, text encoder, teacher, EMA or reward model,
built by a class or `from_pretrained`) is reported, without a fix, when it is moved to a fixed
index, or to a bare `"cuda"` before the rank's device is set with no later move. Moved to a bare
`"cuda"` after the Accelerator exists, it is on the rank's own GPU: at most a hint. Devices from
`accelerator.device` or `LOCAL_RANK`, dtype-only moves and `Accelerator(device_placement=False)`
are left alone.

## Why is this bad?
Constructing an `Accelerator` calls `torch.cuda.set_device(local_rank)`; until then `"cuda"`
means `cuda:0` on every rank, and `"cuda:0"` always does. So every process loads a full copy onto
GPU 0 (out of memory, or heavy contention), and under FSDP/ZeRO the whole unsharded model is
materialised before sharding; a helper that `prepare` never moves stays there. On XLA,
Accelerate rejects a model and optimizer on different devices. For a prepared model the move is
redundant anyway: `prepare` places it on `accelerator.device`. It is a warning because a
single-GPU run is unaffected.

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
Safe. For a model passed to `prepare`, the device move is removed (`.cuda()` is dropped;
`.to("cuda", dtype)` becomes `.to(dtype)`), only when nothing between the move and `prepare`
depends on the model's device (no forward call, no tensor created on its parameters' device);
`prepare` then does the placement. A model that is never prepared gets no fix: it still needs a
placement (`.to(accelerator.device)` after the Accelerator exists).

## At runtime
At `prepare`, a parameter on a device other than the engine's (such as `cuda:0` on local rank 1),
or optimizer parameters that are not the model's own parameter objects, raises ACL501.
""",
)
