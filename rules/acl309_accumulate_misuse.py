"""ACL309 accumulate-misuse: `accumulate()` entered more or less than once per batch."""

from rules._base import Rule

RULE = Rule(
    code="ACL309",
    name="accumulate-misuse",
    summary="`accumulate()` entered twice per batch, several backwards per entry, or a bad loader",
    severity="error",
    fix="none",
    runtime="full",
    static=True,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Flags, once per loop iteration: a second `accumulate(` entry on the same path (in sequence,
nested, two items of one `with`, or through a helper function that enters one); a backward in a
loop nested inside the block, or a second backward on the same path whose loss shares a model with
the first (two engines each backpropagating their own model once are fine); a loader loop nested
inside the block; and a block in a loop over a loader visibly built by `DataLoader(...)` that never
went through `prepare`, or over batches drawn with `next(...)`. Loaders returned by `prepare`,
`prepare_data_loader` or `skip_first_batches(<prepared>)` (also under `enumerate`/`tqdm`, and
parameters whose callers pass one) are tracked; a loader of unknown origin is not flagged; a
`GradientAccumulationPlugin(sync_with_dataloader=False)` turns the loader checks off.

## Why is this bad?
The micro-step counter ticks once per `accumulate()` entry. (a) One entry per model ticks it twice
per batch: with K = 4 the second context syncs every 2 batches (each step carries 2/4 of the
intended gradient), the first syncs only on the loader's last batch, and under DDP the first
model's forward always runs under `no_sync`, so its replicas drift apart. (b) m forward/backward
pairs in one entry count as one micro-step, so a window spans m·K backwards and the gradient is
m times the intended mean. (c) Over an unprepared loader, a manual `next()` loop or an early
`break`, the end-of-loader flush never fires and windows straddle epochs; a loader loop nested in
the last outer batch syncs on every inner step.

## Example
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
encoder, head, opt, dl = accelerator.prepare(encoder, head, opt, dl)
for batch in dl:
    with accelerator.accumulate(encoder):
        feats = encoder(batch["x"])
    with accelerator.accumulate(head):          # second tick for the same batch
        accelerator.backward(crit(head(feats), batch["y"]))
        opt.step(); opt.zero_grad()
```

## Use instead
```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
encoder, head, opt, dl = accelerator.prepare(encoder, head, opt, dl)
for batch in dl:
    with accelerator.accumulate(encoder, head):  # one tick, both models
        accelerator.backward(crit(head(encoder(batch["x"])), batch["y"]))
        opt.step(); opt.zero_grad()
```

## Fix safety
No autofix: merging contexts or backward calls restructures the training step, and the right shape
depends on how the models and losses relate.

## At runtime
The guard counts `accumulate` entries and backward calls per batch drawn from the wrapped loader
(more than one of either gives ACL309), checks inside `accumulate()` that the active loader is a
prepared one, and under DDP checks in forward pre-hooks that all DDP modules of a window agree on
`require_backward_grad_sync`.
""",
)
