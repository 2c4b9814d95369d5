"""ACL504 logged-scaled-loss: logging a loss that was divided by K or multiplied by the scale."""

from rules._base import Rule

RULE = Rule(
    code="ACL504",
    name="logged-scaled-loss",
    summary="the logged loss is divided by K or multiplied by the loss scale",
    severity="warning",
    fix="none",
    runtime="none",
    static=True,
    hint=(
        "`.item()` on the loss on every micro-step of an accumulation window (a device sync per"
        " micro-step; the value is one micro-batch's loss)."
    ),
    docs="""\
## What it does
Flags `.item()` on, or a logger call (`print`, `writer.add_scalar`, `wandb.log`, `logger.info`,
`accelerator.log`, a progress bar's `set_postfix`, ...) reading, a loss that the loop divided by
K (`loss = loss / K`, `loss /= K`, `.div(K)`) or bound to `scaler.scale(...)`, at any cadence:
on every micro-step, on the update step, under a log-interval condition (`if step % 50 == 0:`)
or after a micro-step loop (nanoGPT's `lossf = loss.item()` without its `* K`). Logging it
rarely does not make it the loss. Loss-named values divided by K count also when the backward
runs inside a helper the linter cannot see. As a hint (severity info), it flags `.item()` on
the undivided loss on every micro-step of a manual accumulation window (also into a running
sum, `running += loss.item()`): not on the update step or under a step or log-interval
condition, where one sync per window or less is the right cadence. Not flagged: a value
multiplied back by K, window sums of the divided parts (`window += loss.item()`,
`window_sum / K`), and the loss of `accelerator.backward` (the engine divides a copy;
`accelerator.gather(loss)` too).

## Why is this bad?
The number in the logs is not the training objective. After a manual `/ K` it is K times too small
(so runs with accumulation look better than runs without); after `scaler.scale` it is S times too
large (values in the millions); logging only the last micro-batch of a window is a noisy
single-batch estimate; and `.item()` on every micro-step forces a device-to-host sync each time,
which slows training. Training itself is unaffected, hence a warning.

## Example
```python
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / K
    loss.backward()
    writer.add_scalar("train/loss", loss.item(), i)     # K x too small, syncs every micro-step
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step(); opt.zero_grad()
```

## Use instead
```python
import torch
window_sum = torch.zeros(())
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y)
    window_sum += loss.detach()                          # stays on the device
    (loss / K).backward()
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step(); opt.zero_grad()
        writer.add_scalar("train/loss", (window_sum / K).item(), i)
        window_sum = torch.zeros_like(window_sum)
```

## Fix safety
No autofix: a correct log needs a window accumulator and a logging condition, which changes the
structure of the loop.
""",
)
