"""ACL502 eval-without-no-grad: evaluation with gradients on, in train mode, or never undone."""

from rules._base import Rule

RULE = Rule(
    code="ACL502",
    name="eval-without-no-grad",
    summary="evaluation without `no_grad` / `model.eval()`, or training resumed in eval mode",
    severity="error",
    fix="none",
    runtime="partial",
    static=True,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Flags model calls in a loop over a loader named like `val` / `eval` / `valid` / `test`, or in a
function named like `validate` / `evaluate`, that are not under `torch.no_grad()`,
`torch.inference_mode()` or `torch.set_grad_enabled(False)` (as a context or a decorator); such
evaluation without a preceding `model.eval()`; and `model.eval()` in the epoch loop with no
`model.train()` before the next training step.

## Why is this bad?
Evaluating with gradients on records an autograd graph for every batch, wasting time and memory
and risking OOM. Evaluating without `model.eval()` keeps dropout active and lets BatchNorm update
its running statistics from evaluation data. Forgetting `model.train()` afterwards leaves dropout
off and BatchNorm frozen for the rest of training. The last two fail silently.

## Example
```python
def validate(model, loader):
    model.eval()
    return sum(crit(model(x), y).item() for x, y in loader) / len(loader)
# training resumes in eval mode, and the graph was built for every batch
```

## Use instead
```python
@torch.no_grad()
def validate(model, loader):
    model.eval()
    try:
        return sum(crit(model(x), y).item() for x, y in loader) / len(loader)
    finally:
        model.train()
```

## Fix safety
No autofix: adding `no_grad` or mode switches would break evaluation code that needs gradients on
purpose (test-time adaptation, saliency maps), which the linter cannot always tell apart.

## At runtime
Partial: each engine training step asserts `model.training` (a training step in eval mode gives
ACL502), the engine's evaluation helper asserts that gradients are disabled, and a forward of a
prepared model in eval mode with gradients on and no backward before the next training forward
gives a warning. A user's own evaluation loop in train mode is not detected.
""",
)
