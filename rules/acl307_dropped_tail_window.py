"""ACL307 dropped-tail-window: the last len(dl) % K micro-batches of an epoch never step."""

from rules._base import Rule

RULE = Rule(
    code="ACL307",
    name="dropped-tail-window",
    summary="the step gate has no last-batch clause: the epoch's tail micro-batches never step",
    severity="error",
    fix="unsafe",
    runtime="full",
    guard_levels=("error", "warning"),
    static=True,
    docs="""\
## What it does
Flags a modulo step gate such as `(i + 1) % K == 0`, `i % K == K - 1` or `step % K == 0` (also bound
to a name, `is_update = ...`, or as an early `if (i + 1) % K != 0: continue`) where `i` is the
`enumerate` index of a loop over a loader with a length (a name, or one wrapped in `tqdm`), or a
counter restarted for each pass over such a loader (`micro_step = 0` in the epoch loop, `micro_step
+= 1` per batch), and the condition has no other way to the update step (`or i + 1 == len(dl)`, `or
is_last`, `or accelerator.sync_gradients`). Left alone: counters set once before all epochs
(`global_step % K`), `while` loops and `enumerate(cycle(dl))` / `enumerate(iter(dl))`, where windows
may span epochs on purpose; loaders without a length (a DataLoader over an `IterableDataset`, a
streaming or `to_iterable_dataset()` dataset, a generator), on which `len()` raises; one pass over
the loader ended by a step budget that can come before the loader's end (`if iter_num > max_iters:
break`, no epoch loop), which has no epoch tail. A budget the code sizes from the data (an epoch
count, `len(...)`, a sample count over the batch size, as in `num_epochs * (epoch_size //
micro_batch_size)`) does not end a single pass early, so that pass still loses its tail. Also left
alone: a K above 1 only under DeepSpeed (`K = cfg["gradient_accumulation_steps"] if
accelerator.state.deepspeed_plugin else 1`), whose engine steps itself; an optimizer step after the
loop that flushes the tail; `accumulate()`.

The message counts what the gate leaves after its last update of a pass: `len(dl) % K` for
`(i + 1) % K == 0` and `i % K == K - 1` over a 0-based index, `(len(dl) - 1) % K` for
`i % K == 0`, one more when the gate runs before the batch's backward.

## Why is this bad?
When len(dl) % K = r is not 0, the last r micro-batches of each epoch do not reach the optimizer in
that epoch. Since `zero_grad` is gated too, their gradients stay in `.grad` and join the next
epoch's first window (K + r micro-batches, weight (K + r)/K); in the final epoch they are lost, and
with K > len(dl) nothing ever steps. Frameworks that flush the tail, Accelerate included, still
divide it by K, so it counts r/K of a full window.

## Example
```python
for epoch in range(epochs):
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            opt.step(); opt.zero_grad()
```

## Use instead
```python
for epoch in range(epochs):
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        if (i + 1) % K == 0 or i + 1 == len(dl):
            opt.step(); opt.zero_grad()
```

## Fix safety
Unsafe. `or <index> + 1 == len(<loader>)` is appended to the gate. That adds an optimizer step per
epoch (changing schedule progress and step-based logging), and the tail is still divided by K
(weight r/K, as in Accelerate). Never offered for a loader that may have no `len` (no finding
there), nor when the loop does not `enumerate` the loader or the gate runs before the backward.

## At runtime
When a pass over a sized loader ends with micro-batches that no step consumed, the guard notes the
tail and judges it by its fate: an error before the next step if that step takes more backward
passes than the optimizer's usual window (the tail leaked into it), an error at a `zero_grad` that
throws it away, a warning at exit if the run ends with it still in `.grad`. A window that still
completes with the usual number of passes spanned the pass end on purpose (nanoGPT's `while` loop
over `next(iter(loader))`, a counter kept across epochs) and is not reported. The engine itself
always flushes the tail (divided by K, as Accelerate does) and prints its r/K weight once as a
note on stderr (not a finding: `Engine(tail="exact")` weights it as a full batch).
""",
)
