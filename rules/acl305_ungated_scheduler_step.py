"""ACL305 ungated-scheduler-step: a scheduler stepped on micro-steps or on skipped steps."""

from rules._base import Rule

RULE = Rule(
    code="ACL305",
    name="ungated-scheduler-step",
    summary="`sched.step()` outside the update-step branch: the schedule runs K times too fast",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    guard_levels=("error", "warning"),
    hint=(
        "variant (b): `sched.step()` or an EMA update right after "
        "`scaler.step()`/`scaler.update()` with no test for a skipped step. PyTorch's own AMP "
        "recipe has this shape, and it is usually harmless (a skip shifts the schedule by one "
        "step)."
    ),
    docs="""\
## What it does
Flags `sched.step()` that runs unconditionally on every micro-step of a manual accumulation loop
(variant a): outside the condition that guards `opt.step()`, or inside a `for micro_step in
range(K)` loop. Left alone: `accumulate()` (a prepared scheduler is gated by the wrapper),
schedulers stepped outside the batch loop (per epoch), calls with an argument
(`ReduceLROnPlateau.step(metric)`, `step(epoch)`), schedulers under any test (a skip test, an
epoch-end test), and schedules sized in micro-steps on purpose: a length the scheduler is built
with that counts micro-batches (`len(dl) * epochs` not divided by K, `num_training_steps=max_steps
* K`, or a warm-up multiplied by K beside a bare count) matches stepping on every micro-step. A
length in optimizer steps (divided by K, or `max_train_steps` computed from `len(dl) / K`) is
named in the message. As a hint (the message starts with `hint:`, no fix; off by default, shown with
`--hints` and never failing a run), it also flags `sched.step()` or an EMA update
(`ema.update(...)`) in the same block right after `scaler.step()` / `scaler.update()` of a
GradScaler that may be enabled (variant b). That is the shape of PyTorch's AMP recipe with a
scheduler, so by default it lints clean.

## Why is this bad?
(a) In a manual accumulation loop, a scheduler stepped outside the update-step branch moves once per
micro-batch, so the schedule runs K times too fast: warm-up is K times shorter and a cosine reaches
its floor after 1/K of training. (b) An fp16 scaler skips the optimizer on inf/NaN; stepping the
scheduler anyway shifts the schedule by one position per skipped step (and triggers torch's
scheduler-before-optimizer warning when the very first step is skipped), and an EMA updated on a
skipped step averages in a non-update.

## Example
```python
for i, (x, y) in enumerate(dl):
    (crit(model(x), y) / K).backward()
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step(); opt.zero_grad()
    sched.step()                            # every micro-batch
```

## Use instead
```python
for i, (x, y) in enumerate(dl):
    (crit(model(x), y) / K).backward()
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step(); opt.zero_grad()
        sched.step()
```

## Fix safety
Safe for variant (a): the `sched.step()` statement moves into the branch that steps the optimizer,
right after the step, which is where one scheduler step per optimizer step belongs. Variant (b)
has no fix.

## At runtime
The guard wraps `scheduler.step` and requires at least one real optimizer step since the previous
scheduler step: the inner `step` ran and the scaler did not back off. With no step attempted
since, it raises ACL305; when the one step attempted since was skipped by the GradScaler, it
warns; when several attempts were all skipped (an epoch-level scheduler while the fp16 scale
calibrates), it stays silent.
""",
)
