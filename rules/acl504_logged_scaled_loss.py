"""ACL504 logged-scaled-loss: logging a loss that was divided by N or multiplied by the scale."""

from rules._base import Rule

RULE = Rule(
    code="ACL504",
    name="logged-scaled-loss",
    summary="the logged loss is divided by N or multiplied by the loss scale",
    severity="warning",
    fix="none",
    runtime="none",
    static=False,
    docs="""\
## What it does
Flags `.item()` or a logger call on a name bound to `X / K` or to `scaler.scale(...)`. As a hint,
it also flags `.item()` on the loss in every iteration of a micro-step loop.

## Why is this bad?
The number in the logs is not the training objective. After a manual `/ N` it is N times too small
(so runs with accumulation look better than runs without); after `scaler.scale` it is S times too
large (values in the millions); logging only the last micro-batch of a window is a noisy
single-batch estimate; and `.item()` on every micro-step forces a device-to-host sync each time,
which slows training. Training itself is unaffected, hence a warning.

## Example
```python
loss = crit(model(x), y) / N
loss.backward()
writer.add_scalar("train/loss", loss.item(), step)     # N x too small, syncs every micro-step
```

## Use instead
```python
loss = crit(model(x), y)
window_sum += loss.detach()                           # stays on the device
(loss / N).backward()
if (i + 1) % N == 0:
    writer.add_scalar("train/loss", (window_sum / N).item(), step)
    window_sum = torch.zeros_like(window_sum)
```

## Fix safety
No autofix: a correct log needs a window accumulator and a logging condition, which changes the
structure of the loop.
""",
)
