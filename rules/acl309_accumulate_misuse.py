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
Flags two or more `accumulate(` entries per loop iteration (in sequence or nested); two or more
backward calls reachable within one block, including one in an inner loop; an `accumulate()` block
in a loop over a loader that did not come from `prepare` or that is driven by `next(...)`; and a
loader loop nested inside the block.

## Why is this bad?
The micro-step counter ticks once per `accumulate()` entry. (a) One entry per model ticks it twice
per batch: with N = 4 the second context syncs every 2 batches (each step carries 2/4 of the
intended gradient), the first syncs only on the loader's last batch, and under DDP the first
model's forward always runs under `no_sync`, so its replicas drift apart. (b) k forward/backward
pairs in one entry count as one micro-step, so a window spans k·N backwards and the gradient is
k times the intended mean. (c) Over an unprepared loader, a manual `next()` loop or an early
`break`, the end-of-loader flush never fires and windows straddle epochs; a loader loop nested in
the last outer batch syncs on every inner step.

## Example
```python
for batch in dl:
    with accelerator.accumulate(encoder):
        feats = encoder(batch["x"])
    with accelerator.accumulate(head):          # second tick for the same batch
        accelerator.backward(crit(head(feats), batch["y"]))
        opt.step(); opt.zero_grad()
```

## Use instead
```python
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
