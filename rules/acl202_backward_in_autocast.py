"""ACL202 backward-in-autocast: a backward call lexically inside an enabled autocast region."""

from rules._base import Rule

RULE = Rule(
    code="ACL202",
    name="backward-in-autocast",
    summary="backward runs inside an autocast region, which is meant to cover the forward only",
    severity="warning",
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
PyTorch recommends that autocast wrap only the forward pass and the loss; backward passes under
autocast are "not recommended". In eager mode the damage is usually small, because backward ops
run in the dtype autocast chose for the matching forward op, whatever the region says. It
matters where code in the backward looks at the ambient autocast state:

- a custom `torch.autograd.Function` whose `backward` is not decorated with
  `torch.amp.custom_bwd` runs its torch ops under the enclosing region, so its matmuls are cast
  to the region's dtype (`custom_bwd` restores the forward's state instead);
- `torch.compile` traces the backward of a compiled region at forward time, assuming an autocast
  state for it (`torch._functorch.config.backward_pass_autocast`); PyTorch warns that a wrong
  assumption can make results silently incorrect, so where the backward runs should be the
  deliberate choice the AMP recommendation makes;
- gradient hooks (and anything else they call) see autocast switched on.

`torch.utils.checkpoint` is not affected: it re-runs the forward under the autocast state it
recorded in the forward.

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
because moving it would change the precision of those statements. A `with` that enters other
contexts too (`with accelerator.no_sync(model), accelerator.autocast():`) is split instead: the
other contexts stay around the whole body, backward included, and a `with` of its own holds the
autocast around the statements before the backward. Autocast is then entered after the others,
so this is offered only when the items after the autocast one are gradient-sync switches
(`no_sync`, `accumulate`), whose entering neither reads nor changes the autocast state;
otherwise there is no fix.

## At runtime
`engine.backward` asserts that autocast is off on its device. In raw loops a gradient hook on the
parameters sees `torch.is_autocast_enabled(dev)` true during a backward that runs under autocast
and reports ACL202.
""",
)
