"""ACL505 clip-exhausted-iterator: clipping an iterator that the optimizer already consumed."""

from rules._base import Rule

RULE = Rule(
    code="ACL505",
    name="clip-exhausted-iterator",
    summary="clipping a parameter iterator the optimizer already consumed: nothing is clipped",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags a clip call (`torch.nn.utils.clip_grad_norm_` / `clip_grad_value_` under any alias,
`accelerator.clip_grad_norm_`) whose parameters are a name bound to `filter(...)`, `map(...)`, a
generator expression or `<module>.parameters()` (also `self.params` set in another method) that
something read before the clip (an optimizer constructor, a `list(...)`, a loop over it), or that
the same clip already consumed on an earlier iteration of its loop. Lists, tuples, list
comprehensions and fresh `model.parameters()` calls at the clip site are left alone.

## Why is this bad?
An iterator can be consumed once. The optimizer constructor exhausts it, so the later clip call
receives an empty iterator: clipping silently does nothing and the returned norm is 0.

## Example
```python
import torch
params = filter(lambda p: p.requires_grad, model.parameters())
opt = torch.optim.AdamW(params, lr=1e-4)
...
torch.nn.utils.clip_grad_norm_(params, 1.0)      # empty: nothing clipped
```

## Use instead
```python
import torch
params = list(filter(lambda p: p.requires_grad, model.parameters()))
opt = torch.optim.AdamW(params, lr=1e-4)
...
torch.nn.utils.clip_grad_norm_(params, 1.0)
```

## Fix safety
Safe. The binding is wrapped in `list(...)` (a generator expression becomes a list
comprehension). The optimizer receives the same parameters in the same order, and the clip call
now sees them too.

## At runtime
The guard's clip wrapper materialises its argument; an empty parameter list while the optimizers
hold trainable parameters reports ACL505.
""",
)
