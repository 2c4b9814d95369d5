"""ACL405 ddp-sync-bypassed: a DDP model whose gradients are never all-reduced on real steps."""

from rules._base import Rule

RULE = Rule(
    code="ACL405",
    name="ddp-sync-bypassed",
    summary="DDP gradient sync bypassed (`model.module(...)`, a stuck sync flag): replicas diverge",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags a call of `<ddp>.module(...)` / `<ddp>.module.forward(...)` on the assignments that lead to
a backward (not `model.module` for saving, attributes, generation or evaluation under
`no_grad`); a `<ddp>.require_backward_grad_sync = <expr>` whose every assignment in the loop is
false on the micro-steps that step the optimizer (a literal `False`, or an expression of the
micro-step index and K, such as `micro_step == K` in `for micro_step in range(K)`, evaluated for
several K; an expression the linter cannot evaluate is trusted); and an unconditional
`with <ddp>.no_sync():` (or a `with ctx:` whose `ctx` is bound to it) that holds the optimizer
step.

## Why is this bad?
The gradients of the DDP model are never all-reduced on the steps that count, so the replicas
silently drift apart. Typical causes: the forward goes through `model.module(...)`, the unwrapped
module that bypasses DDP's hooks; `require_backward_grad_sync` is set from an expression that stays
false (such as `micro_step == K - 1` with a counter that never gets there); or `no_sync()` also
covers the micro-step that steps.

## Example
```python
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(net, device_ids=[rank])
for batch in dl:
    loss = model.module(batch).mean()       # DDP hooks bypassed
    loss.backward(); opt.step(); opt.zero_grad()
```

## Use instead
```python
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(net, device_ids=[rank])
for batch in dl:
    loss = model(batch).mean()
    loss.backward(); opt.step(); opt.zero_grad()
```

## Fix safety
Safe for `model.module(x)` feeding a backward: it becomes `model(x)`, which runs the same module
through DDP's hooks. The other forms have no fix.

## At runtime
The guard's DDP communication hook counts all-reduces; an optimizer step with no all-reduce since
the previous one (world size > 1) reports ACL405. A replica-consistency check also compares one
checksum of the trainable parameters across ranks (one small all-reduce) before and after the first
optimizer step and then every `replica_every` steps (100; `guard.configure(replica_every=M)` or
`ACCEL_GUARD_REPLICA_EVERY`), and reports the first step at which the replicas differed, with the
likely cause when it is known (parameters replaced or re-created after wrapping, a sync flag left
off, no initial broadcast).
""",
)
