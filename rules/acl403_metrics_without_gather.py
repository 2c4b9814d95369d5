"""ACL403 metrics-without-gather: evaluation metrics fed by `gather` or by one rank's shard."""

from rules._base import Rule

RULE = Rule(
    code="ACL403",
    name="metrics-without-gather",
    summary="metrics from `accelerator.gather` count padded duplicates; use `gather_for_metrics`",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags `accelerator.gather(` in evaluation (a loop over a loader named like `eval`, `val`,
`valid`, `test`, or anywhere in a function named like `evaluate` / `validate`, outside training
loops) whose result reaches a metric: a call such as `add_batch`, `update`, `compute`, `append`
or `extend`, a function named like a metric (`accuracy(...)`), or a running total (`correct +=`),
directly or through the names it is assigned to. Gathered values whose padded tail is cut off by
hand (`preds = preds[: len(dl.dataset) - seen]`) are left alone. Without a fix, it also flags
`metric.add_batch(...)` of an `evaluate.load(...)` metric in a loop over a prepared loader that
gathers nothing (torchmetrics objects synchronise themselves and are not flagged), and a count
of correct predictions (`correct += (preds == labels).sum().item()`) over a loader seen coming
from `prepare` that no `reduce`, `gather` or `all_reduce` combines afterwards, in the function
or in the caller it is returned to. Both un-gathered findings are wrong only under a
multi-process launch, so they are latent warnings.

## Why is this bad?
A prepared evaluation loader pads its last batch with repeated samples so that every process runs
the same number of batches. `accelerator.gather` keeps those repeats, so metrics are computed on
the dataset plus padding (for example 10,167 predictions for 10,000 samples). A metric updated from
predictions that were never gathered describes only this process's 1/W shard.

## Example
```python
import torch
from accelerate import Accelerator
accelerator = Accelerator()
model, eval_dl = accelerator.prepare(model, eval_dl)
for batch in eval_dl:
    with torch.no_grad():
        preds = model(**batch).logits.argmax(-1)
    p, r = accelerator.gather((preds, batch["labels"]))
    metric.add_batch(predictions=p, references=r)
```

## Use instead
```python
import torch
from accelerate import Accelerator
accelerator = Accelerator()
model, eval_dl = accelerator.prepare(model, eval_dl)
for batch in eval_dl:
    with torch.no_grad():
        preds = model(**batch).logits.argmax(-1)
    p, r = accelerator.gather_for_metrics((preds, batch["labels"]))
    metric.add_batch(predictions=p, references=r)
```

## Fix safety
Safe. `accelerator.gather(` becomes `accelerator.gather_for_metrics(` with the same arguments; the
result is identical except that the duplicated samples of the loader's last batch are dropped.

## At runtime
The guard counts gathered samples per evaluation pass and compares the total with
`len(eval_dataset)` at the end; more samples than the dataset holds gives ACL403. It also notes
metric-bound `gather` calls on a last batch with a non-zero remainder.
""",
)
