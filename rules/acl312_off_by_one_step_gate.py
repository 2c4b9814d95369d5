"""ACL312 off-by-one-step-gate: a step gate that fires one micro-step early or late."""

from rules._base import Rule

RULE = Rule(
    code="ACL312",
    name="off-by-one-step-gate",
    summary="the accumulation step gate is off by one: the first window has 1 micro-batch",
    severity="error",
    fix="unsafe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags a modulo step gate that fires one micro-batch off the end of its window, worked out from
where its index starts: `i % K == 0` where `i` is the index of a 0-based `enumerate(...)` or a
counter that starts at 0 and is incremented after the gate, and `(i + 1) % K == 0` where `i`
comes from `enumerate(..., start=1)` or a counter incremented before the gate. A gate placed
before the backward (`if i % K == 0: opt.step()` at the top of the loop) steps the previous
window and is counted that way. Counters advanced on the update step (they count optimizer
steps) and counters whose start is not a literal are left alone.

## Why is this bad?
`if step % K == 0:` over a 0-based `enumerate` fires after the very first micro-batch, so the first
update uses 1 micro-batch (1/K of a window) and every later window is shifted; `(step + 1) % K`
over a counter that already starts at 1 errs the other way. With a loss divided by K the first
update is K times too small, and the last batches of the epoch fall into a window that never
steps.

## Example
```python
for step, (x, y) in enumerate(dl):
    (crit(model(x), y) / K).backward()
    if step % K == 0 or step + 1 == len(dl):        # fires after the first batch
        opt.step(); opt.zero_grad()
```

## Use instead
```python
for step, (x, y) in enumerate(dl):
    (crit(model(x), y) / K).backward()
    if (step + 1) % K == 0 or step + 1 == len(dl):
        opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. The gate is rewritten to `(i + 1) % K == 0` (or to `i % K == 0` for 1-based counters).
The window boundaries move, so the exact updates change.

## At runtime
The guard counts backward calls between optimizer steps; a first window of one micro-step followed
by windows of K reports ACL312.
""",
)
