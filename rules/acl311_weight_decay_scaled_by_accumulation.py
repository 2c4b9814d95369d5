"""ACL311 weight-decay-scaled-by-accumulation: weight decay multiplied or divided by K."""

from rules._base import Rule

RULE = Rule(
    code="ACL311",
    name="weight-decay-scaled-by-accumulation",
    summary="`weight_decay` scaled by the accumulation steps: regularisation K× off the reference",
    severity="warning",
    fix="none",
    runtime="none",
    static=True,
    docs="""\
## What it does
Flags a `weight_decay=` argument (of an optimizer constructor or any factory) or a
`"weight_decay":` entry of a parameter-group dict whose expression, or the one its name is bound
to, multiplies or divides by an expression that spells K (`args.grad_accum`, `self.accum`,
`cfg["accum_iter"]`, a constant). A K that scales a learning rate inside the expression
(`wd / (lr * K)`, a coupled/decoupled conversion) is not counted.

## Why is this bad?
Accumulation exists to reproduce one optimizer step on the large batch, so every hyperparameter of
that step should stay as it is. torch optimizers apply weight decay inside `step()`: decoupled
decay (AdamW) once per step, coupled decay (`weight_decay` of SGD/Adam) once on the already
averaged gradient. Neither depends on how many micro-batches built the gradient, so scaling λ by K
makes regularisation K times stronger or weaker than in the large-batch run. It is a warning
because a deliberately tuned λ is the user's call.

## Example
```python
import torch
opt = torch.optim.AdamW(model.parameters(), lr=3e-4,
                        weight_decay=0.1 * args.grad_accum)    # decay K x stronger
```

## Use instead
```python
import torch
opt = torch.optim.AdamW(model.parameters(), lr=3e-4,
                        weight_decay=0.1)                      # as in the large-batch run
```

## Fix safety
No autofix: the λ the user wants is unknown, and changing it changes training.
""",
)
