"""ACL202 backward-in-autocast: a backward call lexically inside an enabled autocast region."""

from rules._base import Rule

RULE = Rule(
    code="ACL202",
    name="backward-in-autocast",
    summary="backward runs inside an autocast region, which is meant to cover the forward only",
    severity="error",
    fix="safe-when-trailing",
    runtime="full",
    static=True,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Flags `.backward(...)`, `torch.autograd.backward(...)`, `accelerator.backward(...)` or
`engine.backward(...)` written inside an autocast region (`torch.autocast`, `torch.amp.autocast`,
`torch.cuda.amp.autocast`, `accelerator.autocast()`, also through `with ctx:` when `ctx` is bound
to one) whose nearest region is enabled: an `enabled=False` island around the backward, or
`accelerator.autocast()` of an engine pinned to `"no"`, runs it in fp32. A backward in a function
merely called from the region is left to the runtime check.

## Why is this bad?
Autocast is meant for the forward pass. In eager mode backward ops follow the dtypes recorded in
the forward, so the damage is usually small; under `torch.compile`, however, the compiled backward
can pick up the surrounding autocast state and run in fp16, silently producing inf or wrong
gradients. Custom autograd functions and gradient hooks also see autocast switched on during such
a backward.

## Example
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
        scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
```

## Use instead
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
```

## Fix safety
Safe when the backward is trailing: if the backward statement is the last one in the `with` body,
it is moved after the block at the enclosing indentation, which changes nothing but the autocast
state of the backward itself. If any statement follows it inside the block there is no fix,
because moving it would change the precision of those statements.

## At runtime
`engine.backward` asserts that autocast is off on its device. In raw loops a gradient hook on the
parameters sees `torch.is_autocast_enabled(dev)` true during a backward that runs under autocast
and reports ACL202.
""",
)
