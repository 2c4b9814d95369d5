"""ACL503 scaler-not-checkpointed: a resumable checkpoint that leaves out the GradScaler state."""

from rules._base import Rule

RULE = Rule(
    code="ACL503",
    name="scaler-not-checkpointed",
    summary="checkpoint saves the optimizer but not the GradScaler: steps are skipped after resume",
    severity="warning",
    fix="none",
    runtime="none",
    static=True,
    docs="""\
## What it does
Flags `torch.save` of a dict that holds an optimizer's `state_dict()` but no scaler state, in a
module with a GradScaler that is not literally disabled. The dict is read as written inline
(`{...}` or `dict(...)`) or as built step by step before the save (`ckpt = {...}`,
`ckpt["epoch"] = epoch`, `ckpt.update(...)`); a scaler under any key (`"scaler"`, `"amp"`,
`"grad_scaler"`, or any value read from the scaler) counts. One dict saved twice is one finding.
`accelerator.save_state(...)`, weights-only saves and dicts with parts it cannot see
(`**extra`) are left alone.

## Why is this bad?
The scaler's state (current scale and growth tracker) is part of the training state. A resumable
checkpoint without it restarts the scale at its initial value, 65536: if the run had settled at
2^k with k < 16, roughly 16 - k steps after resuming overflow and are silently skipped. Leaving out
the scheduler restarts the learning-rate schedule, and a checkpoint taken mid-window loses or
repeats micro-batches on resume. It is a warning because only resumed runs are affected.

## Example
```python
import torch
scaler = torch.amp.GradScaler("cuda")
...
torch.save({"model": model.state_dict(),
            "optimizer": opt.state_dict()}, path)
```

## Use instead
```python
import torch
scaler = torch.amp.GradScaler("cuda")
...
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "scaler": scaler.state_dict()}, path)
```

## Fix safety
No autofix: the loading side must restore the new key too, and the linter cannot pair saves with
loads reliably.
""",
)
