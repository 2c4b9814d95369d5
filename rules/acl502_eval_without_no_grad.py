"""ACL502 eval-without-no-grad: evaluation with gradients on, in train mode, or never undone."""

from rules._base import Rule

RULE = Rule(
    code="ACL502",
    name="eval-without-no-grad",
    summary="evaluation without `no_grad` / `model.eval()`, or training resumed in eval mode",
    severity="warning",
    fix="none",
    runtime="partial",
    static=True,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Flags, once per evaluation, the first model call (`model(x)`, `self.net(x)`, `model.module(x)`)
in a loop or comprehension over a loader named like `val` / `eval` / `valid` / `test`, or in a
function named like `validate` / `evaluate` / `test`, that runs with gradients on: not under
`torch.no_grad()`, `torch.inference_mode()` or `torch.set_grad_enabled(...)` (as a context, a
decorator, or a statement earlier in the function), and not in a function that every caller in
the file calls with gradients off. In a file with dropout or BatchNorm that never calls `.eval()`,
it also flags evaluation run in training mode. And it flags a `model.eval()` that runs in the
epoch loop (directly or in a function it calls) when nothing in that loop calls `model.train()`
again, for a model the training loop trains. Evaluation that needs gradients (a backward,
`autograd.grad`, `enable_grad`), `model.generate(...)`, and Lightning's own hooks
(`validation_step`, `test_step`) are left alone.

## Why is this bad?
Evaluating with gradients on records an autograd graph for every batch, wasting time and memory
and risking OOM. Evaluating without `model.eval()` keeps dropout active and lets BatchNorm update
its running statistics from evaluation data. Forgetting `model.train()` afterwards leaves dropout
off and BatchNorm frozen for the rest of training. The last two fail silently.
Gradients alone are a warning: the results are right, only time and memory are wasted. A
finding that includes a wrong mode (evaluation in training mode, or training resumed in eval
mode) is an error.

## Example
```python
import torch
def validate(model, loader):
    model.eval()
    return sum(crit(model(x), y).item() for x, y in loader) / len(loader)
# training resumes in eval mode, and the graph was built for every batch
```

## Use instead
```python
import torch
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
