"""ACL103 scaler-update-missing: `scaler.step` without `scaler.update()` on every stepping path."""

from rules._base import Rule

RULE = Rule(
    code="ACL103",
    name="scaler-update-missing",
    summary="`scaler.step` with no `scaler.update()`: the next step raises, the scale never adapts",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags `scaler.step(...)` in a loop (or a per-batch method called from one) when no `update()` of
the same scaler follows it in every iteration that steps: none at all, one only in a logging
branch, or one after the loop. One finding per path, on its last `scaler.step`. An update in a
function of the module that the loop calls unconditionally counts. In a scaler wrapper function
no loop owns (a timm-style `__call__`), it is flagged only when nothing in the module updates that
scaler. Not flagged: one `update()` after several `scaler.step(opt_i)` calls, steps of prepared
optimizers, scalers built with a literal `enabled=False`.

## Why is this bad?
`scaler.update()` adapts the loss scale and puts each optimizer back into the `READY` stage.
Without it the stage stays `STEPPED`, and the next `scaler.step` or `unscale_` raises a
`RuntimeError`. When the update only runs on some iterations (say, inside a logging branch) the run
crashes on the first iteration that skips it, and until then the scale never backs off after an
overflow.

## Example
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    opt.zero_grad()             # scaler.update() missing
```

## Use instead
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
```

## Fix safety
Safe. `scaler.update()` is inserted right after the last `scaler.step(...)` of each path that
lacks it, which is the only order the scaler accepts. An update that ran on some iterations only
(a logging branch, or once after the loop) is removed by the same fix, since a second update with
no step in between raises; when removing it would leave an empty block, or when another function
updates a scaler of that name (a caller, once per epoch), there is no fix. One
`update()` after several `scaler.step(opt_i)` calls is the multi-optimizer pattern and is not
flagged.

## At runtime
The guard wraps `scaler.step`: an optimizer already in the `STEPPED` stage raises ACL103 naming
where the previous step happened, instead of torch's generic error. The next forward pre-hook also
checks that no optimizer was left in `STEPPED`.
""",
)
