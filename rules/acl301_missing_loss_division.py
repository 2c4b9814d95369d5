"""ACL301 missing-loss-division: a manual accumulation loop that sums N mean losses."""

from rules._base import Rule

RULE = Rule(
    code="ACL301",
    name="missing-loss-division",
    summary="manual accumulation backpropagates undivided losses: gradients are N times too large",
    severity="error",
    fix="safe",
    runtime="heuristic",
    static=True,
    docs="""\
## What it does
Flags `X.backward()` or `scaler.scale(X).backward()` in a loop whose `opt.step()` is gated by
`% K` (or by a counter compared with K, K > 1) when neither X nor the gradients are divided by K
before the step.

## Why is this bad?
Each micro-batch loss is already a mean, so backpropagating it undivided leaves the sum of N
gradients in `.grad`: N times the gradient of the large-batch mean. For SGD that is an N-times
learning rate. Adam mostly normalises the scale away, but clipping thresholds, the weight of a
coupled L2 term and `eps` change meaning, and under fp16 the larger values overflow more often,
so more steps are skipped.

## Example
```python
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y)
    loss.backward()                         # window sums N mean losses
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
```

## Use instead
```python
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / N
    loss.backward()
    if (i + 1) % N == 0:
        opt.step(); opt.zero_grad()
```

## Fix safety
Safe. `loss = loss / K` is inserted just before the backward when the loss is a plain name;
otherwise the expression becomes `(expr / K).backward()`. K is spelled as in the step gate. No fix
is offered when the loss comes from a call the linter cannot see into, since it might divide
already. `accelerator.backward` and `engine.backward` divide by themselves and are never flagged.

## At runtime
Heuristic, raw loops only. The guard wraps `Tensor.backward` / `torch.autograd.backward` and counts
per-parameter contributions per optimizer step. With k > 1 contributions, no loss whose root node
divides by k (or multiplies by 1/k), and no reduction of the gradient norm before the step, it
warns ACL301.
""",
)
