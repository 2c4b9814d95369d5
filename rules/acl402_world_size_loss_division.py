"""ACL402 world-size-loss-division: dividing the loss by W on top of DDP's gradient average."""

from rules._base import Rule

RULE = Rule(
    code="ACL402",
    name="world-size-loss-division",
    summary="loss divided by the world size although DDP already averages: gradients W× too small",
    severity="error",
    fix="safe",
    runtime="partial",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags a division of the loss by the world size (`dist.get_world_size()`, any
`*_world_size` name, `accelerator.num_processes`, `args.world_size`,
`int(os.environ["WORLD_SIZE"])`, or a name bound to one), alone or as a factor of the divisor
(`loss / (world_size * K)`), on the assignments that lead to the backward of a DDP-wrapped or
prepared model. Not flagged: divided copies that do not reach the backward (logging, a detached
all-reduced clone), a path that also multiplies by W (`loss * W / n_tokens`), loops that
all-reduce `p.grad` by hand, and modules that register a DDP communication hook.

## Why is this bad?
DDP, and so Accelerate's prepared model, already averages gradients over the W ranks. Dividing the
loss by W as well makes gradients W times too small, so the same script trains differently on 1
and on 8 GPUs. All-reducing and dividing a detached copy for logging is fine.

## Example
```python
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
ddp_model = DDP(model, device_ids=[rank])
for x, y in dl:
    loss = crit(ddp_model(x), y)
    loss = loss / dist.get_world_size()         # DDP already averages
    loss.backward()
    opt.step(); opt.zero_grad()
```

## Use instead
```python
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
ddp_model = DDP(model, device_ids=[rank])
for x, y in dl:
    loss = crit(ddp_model(x), y)
    loss.backward()                             # averaged across ranks by DDP
    opt.step(); opt.zero_grad()
```

## Fix safety
Safe. The world-size factor is removed only when the divided value feeds nothing but the backward
(the name is read by no other statement), so logged values and other computations are unchanged:
`loss = loss / W` and `loss /= W` lines are deleted, `expr / W` becomes `expr`, and
`expr / (W * K)` becomes `expr / K`.

## At runtime
Partial: the root of the loss's `grad_fn` is read for a division by W (a multiplication by 1/W,
or 1/(K·W) over a window of K), at `engine.backward` and, in the user's own DDP loop
(`loss.backward()` or `accelerator.backward`), at the optimizer step. In the user's loop the
division by a world-size expression must also be found in the functions around the backward,
so a divisor equal to W by coincidence stays silent, as do models without DDP and DDP with a
communication hook. It is only a warning, and it cannot fire (nor matter) when W = 1.
""",
)
