"""ACL401 ddp-missing-no-sync: DDP all-reduces on every micro-step of an accumulation window."""

from rules._base import Rule

RULE = Rule(
    code="ACL401",
    name="ddp-missing-no-sync",
    summary="DDP accumulation without `no_sync()` around the forward: wasted all-reduces",
    severity="warning",
    fix="unsafe",
    runtime="full",
    static=True,
    hint=(
        "an FSDP2 model that reduce-scatters on every micro-step of a manual accumulation "
        "window (skipping the sync would keep the unsharded gradients in memory, so it is a "
        "trade-off, not a bug)."
    ),
    docs="""\
## What it does
Flags a model wrapped in `DistributedDataParallel(` / `DDP(` (any import alias,
`torch.nn.parallel.DistributedDataParallel`, a module helper that returns one, an imported helper
named like `smart_DDP`, or `self.model` in a trainer class) whose forward runs in a manual
accumulation loop (`% K` gate, a counter compared with K, or a `range(K)` micro-step loop, K > 1)
when the loop never controls the sync: no `no_sync` (a plain or conditional context, an `ExitStack`,
a name bound to it, a module function the loop calls, a context manager of the module, or a function
returning one, that enters it on the model it is handed, such as NVlabs' `@contextmanager def
ddp_sync(module, sync)`, or Lightning Fabric's `fabric.no_backward_sync(model, enabled=...)`) and no
`require_backward_grad_sync`. A `with helper(ddp, ...):` around the forward and backward whose
helper comes from another module (`misc.ddp_sync(ddp, sync)`) cannot be read and may enter
`no_sync`, so it is not flagged. Names are resolved per function: another function's parameter or
local of the same name (`def setup(model)`, a `parallelize_fn(model, mesh)` handed to a strategy) is
not the loop's model. Reported at the forward. Also flags a `with m.no_sync():` or `with
accelerator.no_sync(m):` block (or `with ctx:` where `ctx` is bound to `m.no_sync()` or to
`nullcontext() if last else m.no_sync()`, or a module context manager that enters `no_sync`) that
holds a backward but not `m`'s forward, reported at the context; not Fabric's `no_backward_sync`,
whose strategy decides whether the flag is read in the forward (DDP) or the backward (FSDP). A
forward through `m.module(...)` is ACL405's finding, not this one. Not flagged:
`accelerator.accumulate()`, `sync_each_batch=True`, FSDP1, DeepSpeed, apex and fairscale wrappers.

A model returned by `accelerator.prepare(...)` is DDP whenever the script is launched on several
processes: in a loop that gates the optimizer on K itself, with neither `accumulate()` nor
`accelerator.no_sync(model)` around the other micro-steps' forward, it is reported as a latent
warning ("under a multi-process launch", with K's own condition when K comes from a flag), without
a fix.

FSDP2: a model handed to `fully_shard(...)` (from `torch.distributed.fsdp` or
`torch.distributed._composable.fsdp`, any import spelling; as a statement or `m = fully_shard(m)`,
outside a loop) whose forward runs in such a manual accumulation loop that never mentions
`set_requires_gradient_sync` (nor `no_sync`, nor Fabric's `no_backward_sync`) gets a hint
(severity info, no fix) at the forward: it reduce-scatters on every micro-step. A hint, not a
warning, because switching the sync off keeps each unit's unsharded gradients in memory until
the last micro-step. Blocks sharded inside
a loop (`for block in model.layers: fully_shard(block)`) are units of the model, not models of
their own.

## Why is this bad?
DDP all-reduces gradients in every backward unless the forward ran under `no_sync()`. With K-step
accumulation, K - 1 of those all-reduces per optimizer step are wasted. The math is the same
(averaging is linear), but communication grows K-fold, which in one multi-node measurement made
training about 2× slower. Putting only `backward()` under `no_sync()` does nothing, because DDP
reads the flag during the forward.

## Example
```python
from torch.nn.parallel import DistributedDataParallel as DDP
ddp_model = DDP(model, device_ids=[rank])
for i, (x, y) in enumerate(dl):
    last = (i + 1) % K == 0 or i + 1 == len(dl)
    loss = crit(ddp_model(x), y) / K
    with ddp_model.no_sync():               # too late: forward already ran
        loss.backward()
    if last: opt.step(); opt.zero_grad()
```

## Use instead
```python
from contextlib import nullcontext
from torch.nn.parallel import DistributedDataParallel as DDP
ddp_model = DDP(model, device_ids=[rank])
for i, (x, y) in enumerate(dl):
    last = (i + 1) % K == 0 or i + 1 == len(dl)
    with nullcontext() if last else ddp_model.no_sync():
        loss = crit(ddp_model(x), y) / K
        loss.backward()
    if last: opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. The micro-step is restructured so that forward and backward run inside
`ddp_model.no_sync()` on non-final micro-steps, with a conditional context as shown above. That
moves the forward into a new block, interacts with `find_unused_parameters` / `static_graph`, and
changes the order of floating-point summation, so results are not bitwise identical. The
statements from the forward to the backward go under `with nullcontext() if <step condition>
else model.no_sync():` (`micro_step == K - 1` in a micro-step loop), adding `from contextlib
import nullcontext` when needed; a model wrapped in DDP only on some runs (`if ddp: model =
DDP(model)`) gets `getattr(model, "no_sync", nullcontext)()`, so single-process runs still work.
A late `with model.no_sync():` gets the forward moved into it and a conditional context. No fix
when the step condition reads a counter that changes between the forward and the step, when the
forward and backward are in different blocks, or when several DDP models run in the loop.

## At runtime
A forward pre-hook on the DDP module reads `require_backward_grad_sync`; if it is true on a
non-sync micro-step, the guard reports ACL401 as a performance warning. For sharded models
(FSDP2, FSDP1) the guard counts the collectives: it wraps `torch.distributed.reduce_scatter_single`
/ `reduce_scatter_tensor`, marks each backward pass during which one was issued, and reports
ACL401 (a warning) at an optimizer step whose window had more than one such pass (more than one
process, not under `sync_each_batch=True`).
""",
)
