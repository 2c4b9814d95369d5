"""ACL404 sampler-set-epoch-missing: a shuffling DistributedSampler never told the epoch."""

from rules._base import Rule

RULE = Rule(
    code="ACL404",
    name="sampler-set-epoch-missing",
    summary="`DistributedSampler` without `set_epoch(epoch)`: every epoch repeats the same order",
    severity="warning",
    fix="none",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags an epoch loop (a `for` or `while` around the pass) over a training loader built from a
`DistributedSampler(` whose `shuffle` is not literal `False` (bound to a name, one arm of a
conditional, inline in `DataLoader(sampler=...)`, or through a `BatchSampler`), when neither
that loop, nor a module function it calls, nor the function that makes the pass calls
`.set_epoch(` (on the sampler, `dl.sampler`, `dl.batch_sampler.sampler`, or anything that is not
another known sampler). The pass may be a loop in the same function, a module function such as
`train_one_epoch(model, loader, ...)`, or an imported function named for training that is handed
the loader. A loader counts as training when its pass reaches a backward and a `.step()`;
evaluation loaders, loaders given to `accelerator.prepare`, and single passes are not flagged.
Reported at the epoch loop.

## Why is this bad?
`DistributedSampler` seeds its permutation with seed + epoch. Without `set_epoch(epoch)` at the
start of each epoch, every epoch sees the same order and the same split across ranks, quietly
removing much of the randomness shuffling is there for. Accelerate's prepared loaders set the epoch
themselves; raw DDP loops must do it by hand. It is a warning because training still converges,
just with less shuffling than intended.

## Example
```python
from torch.utils.data import DataLoader, DistributedSampler
sampler = DistributedSampler(train_ds, shuffle=True)
dl = DataLoader(train_ds, batch_size=32, sampler=sampler)
for epoch in range(epochs):
    for x, y in dl:
        crit(model(x), y).backward()
        opt.step(); opt.zero_grad()
```

## Use instead
```python
from torch.utils.data import DataLoader, DistributedSampler
sampler = DistributedSampler(train_ds, shuffle=True)
dl = DataLoader(train_ds, batch_size=32, sampler=sampler)
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for x, y in dl:
        crit(model(x), y).backward()
        opt.step(); opt.zero_grad()
```

## Fix safety
No autofix: where the epoch variable lives and which sampler object to call is not always clear
from the loop.

## At runtime
The guard records `sampler.epoch` each time the wrapped loader starts a pass; the same value on two
consecutive passes with shuffling on gives ACL404.
""",
)
