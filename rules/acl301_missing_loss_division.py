"""ACL301 missing-loss-division: a manual accumulation loop that sums K mean losses."""

from rules._base import Rule

RULE = Rule(
    code="ACL301",
    name="missing-loss-division",
    summary="manual accumulation backpropagates undivided losses: gradients are K times too large",
    severity="error",
    fix="safe",
    runtime="heuristic",
    static=True,
    guard_levels=("warning",),
    docs="""\
## What it does
Flags `X.backward()` or `scaler.scale(X).backward()` in a loop whose `opt.step()` is gated by
`% K` (or by a counter compared with K, K > 1) when neither X nor the gradients are divided by K
before the step; also `fabric.backward(X)` and a LightningModule's `self.manual_backward(X)`,
since Lightning scales for precision but leaves the division to the loop. Only the visible
dataflow counts: a loss returned by an imported helper is reported too (without a fix), unless
the helper is handed K or the namespace holding it. A per-batch function (`train_step`) whose
caller gates the optimizer step is checked against that gate; its fix is offered only when K
can be read inside the function (`self.accum`). A loop that steps only through a function of the
module (`if not (i + 1) % K: step()`) is gated by that call's condition.

Not flagged: a loss divided on its way by any divisor (K, the window's sample or token count,
`loss.sum().mul(scale / batch_gpu_total)`); gradients divided before the step (`p.grad.div_(K)`,
`p.grad /= K`, `torch._foreach_div_(grads, K)`), also inside a function or method the loop calls;
a backward whose gradients a step of every iteration consumes (an RL critic stepped each
iteration beside an actor stepped every `policy_frequency` iterations); and a window that sums
its samples on purpose: a loss multiplied by the batch size (`loss * x.size(0)`), or a module
that rescales its weight decay by the window's sample count (YOLO's
`hyp["weight_decay"] *= batch_size * accumulate / nbs`).

## Why is this bad?
Each micro-batch loss is already a mean, so backpropagating it undivided leaves the sum of K
gradients in `.grad`: K times the gradient of the large-batch mean. For SGD that is an K-times
learning rate. Adam mostly normalises the scale away, but clipping thresholds, the weight of a
coupled L2 term and `eps` change meaning, and under fp16 the larger values overflow more often,
so more steps are skipped.

## Example
```python
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y)
    loss.backward()                         # window sums K mean losses
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step(); opt.zero_grad()
```

## Use instead
```python
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y)
    loss = loss / K
    loss.backward()
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step(); opt.zero_grad()
```

## Fix safety
Safe. `loss = loss / K` is inserted just before the backward when the loss is a plain name;
otherwise the expression becomes `(expr / K).backward()`, and each loss of
`torch.autograd.backward([l1, l2])` is divided in place. K is spelled as in the step gate. No fix
is offered when the loss comes from a call the linter cannot see into (an imported helper, a loss
object built from a class outside torch, or a loss callable passed in as a parameter that no
caller of the module fills with a torch loss), since it might divide or sum on purpose already.
`accelerator.backward` and `engine.backward` divide by themselves and are never flagged.

## At runtime
Heuristic warning, raw loops only (the engine and Accelerate divide themselves). At each
backward the guard reads the loss graph's root for a constant factor and notes the line that
called backward. An accumulation window is k passes of the same backward line (separate loss
terms of one batch, as in DCGAN or a multi-task loss, come from different lines and are not one).
With k > 1, no pass divided by about k, no loss scaled up on purpose (`loss * batch_size`), and
no rescaling of the gradients before the step (`p.grad /= k`, `p.grad.data.mul_(...)`, or a norm
clip that would have clipped the divided gradients too), it warns ACL301.
""",
)
