"""ACL401 ddp-missing-no-sync: DDP all-reduces on every micro-step of an accumulation window."""

from rules._base import Rule

RULE = Rule(
    code="ACL401",
    name="ddp-missing-no-sync",
    summary="DDP accumulation without `no_sync()` around the forward: wasted all-reduces",
    severity="warning",
    fix="unsafe",
    runtime="full",
    static=False,
    docs="""\
## What it does
Flags a model wrapped in `DistributedDataParallel(` / `DDP(` used in a manual accumulation loop
with no `no_sync` in the loop, and any `with m.no_sync():` block that contains a backward but not
the model's forward call.

## Why is this bad?
DDP all-reduces gradients in every backward unless the forward ran under `no_sync()`. With N-step
accumulation, N - 1 of those all-reduces per optimizer step are wasted. The math is the same
(averaging is linear), but communication grows N-fold, which in one multi-node measurement made
training about 2× slower. Putting only `backward()` under `no_sync()` does nothing, because DDP
reads the flag during the forward.

## Example
```python
for i, (x, y) in enumerate(dl):
    loss = crit(ddp_model(x), y) / N
    with ddp_model.no_sync():               # too late: forward already ran
        loss.backward()
    if (i + 1) % N == 0: opt.step(); opt.zero_grad()
```

## Use instead
```python
for i, (x, y) in enumerate(dl):
    last = (i + 1) % N == 0
    with nullcontext() if last else ddp_model.no_sync():
        (crit(ddp_model(x), y) / N).backward()
    if last: opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. The micro-step is restructured so that forward and backward run inside
`ddp_model.no_sync()` on non-final micro-steps, with a conditional context as shown above. That
moves the forward into a new block, interacts with `find_unused_parameters` / `static_graph`, and
changes the order of floating-point summation, so results are not bitwise identical.

## At runtime
A forward pre-hook on the DDP module reads `require_backward_grad_sync`; if it is true on a
non-sync micro-step, the guard reports ACL401 as a performance warning.
""",
)
