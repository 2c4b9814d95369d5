"""ACL104 clip-scaled-grads: clipping gradients that are still multiplied by the loss scale."""

from rules._base import Rule

RULE = Rule(
    code="ACL104",
    name="clip-scaled-grads",
    summary="gradient clipping before `unscale_` compares S-times scaled gradients with max_norm",
    severity="error",
    fix="safe",
    runtime="full",
    static=True,
    docs="""\
## What it does
Flags `torch.nn.utils.clip_grad_norm_` / `clip_grad_value_` (under any import spelling) reached
after `scaler.scale(...).backward()` on its path with no `scaler.unscale_(...)`,
`accelerator.unscale_gradients()` or `scaler.step(...)` between them that runs whenever both do
(an unscale only in a logging branch does not count; one under a test of the precision, such as
`if scaler is not None:`, does), in loops, per-batch methods and scaler wrapper functions (a
timm-style `__call__`). A scaled backward or a torch clip inside a function of the module that the
loop calls counts at the call; a clip on the `else` side of the branch that steps through the
scaler is the fp32 path and is not flagged. After an Accelerator's or guard engine's `backward`
it flags torch's clip functions when the engine's precision is fp16 or not statically known, or
when the file configures an FSDP1 plugin: a `FullyShardedDataParallelPlugin(...)` without a
literal `fsdp_version=2`, or an `fsdp_plugin=` argument whose value is not FSDP2. Not after
`mixed_precision="no"` / `"bf16"` without FSDP1 (the guard engine's default is `"no"`), and not
after the engine's own `clip_grad_norm_` or `unscale_gradients()`. FSDP2 is not FSDP1 here:
`FullyShardedDataParallelPlugin(fsdp_version=2)`, the guard engine's `fsdp_plugin=True` /
`guard.FSDP2Plugin(...)` / `"fsdp2"`, and a raw loop over a model sharded with `fully_shard`
shard parameters as DTensors, whose norm torch's `clip_grad_norm_` all-reduces, so only the
loss scale (fp16) matters there. A name passed as `fsdp_plugin=` counts as FSDP2 when every
plugin the file builds is one.

## Why is this bad?
Between `scale()` and `unscale_()` gradients are S times too large, so clipping compares S times
the norm with `max_norm`: almost every step is clipped, the optimizer receives a gradient of norm
about max_norm / S (with SGD, a collapsed learning rate), and the returned norm that gets logged is
S times too large. Under Accelerate, torch's clip function skips the unscale that
`accelerator.clip_grad_norm_` performs; under FSDP1 it computes a per-shard norm, so ranks clip by
different factors.

## Example
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)     # clips S * g
    scaler.step(opt); scaler.update(); opt.zero_grad()
```

## Use instead
```python
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt); scaler.update(); opt.zero_grad()
```

## Fix safety
Safe. In raw loops `scaler.unscale_(opt)` is inserted just before the clip, `opt` being the
optimizer of the next `scaler.step`; `scaler.step` then does not unscale again. With Accelerate or
the engine, `torch.nn.utils.clip_grad_norm_(params, ...)` becomes
`accelerator.clip_grad_norm_(params, ...)`, which takes the same arguments and returns the same
value; `clip_grad_value_` keeps the torch call and gets `accelerator.unscale_gradients()` before
it. When ACL303 also fires, the unscale goes inside the sync gate that ACL303 adds. No fix when no
`scaler.step` follows the clip (which optimizer to unscale is unknown), when the torch call uses
arguments the engine's `clip_grad_norm_` does not take (`error_if_nonfinite=`, `foreach=`), or for
a second flagged clip of the same path until the first one is fixed (a second unscale raises).

## At runtime
While training, the guard patches torch's clip functions. If the scaler is enabled and the
optimizer owning the parameters is still in the `READY` stage (not `UNSCALED`), it raises ACL104.
For FSDP1 modules the call is reported and redirected to the module's own `clip_grad_norm_`
(a warning), and clipping part of an FSDP1 model's parameters is an error (FSDP1 clips the whole
model). For FSDP2 (DTensor parameters) torch's clip returns the all-reduced global norm, which
the guard reads like any other; nothing is reported. With more than one process it reports (an
error, at the clip's line) a clip over the local shards of FSDP2's DTensors: plain tensors
sharing their storage with the local tensor of a DTensor parameter or gradient that an optimizer
trains (`p.to_local()`, `p._local_tensor`, `p.grad.to_local()`), passed to `clip_grad_norm_`,
`clip_grad_value_` or `clip_grads_with_norm_` (such a tensor has no `.grad`: nothing is clipped),
and `clip_grads_with_norm_` given a norm that `torch.nn.utils.get_total_norm` measured over such
shards (each rank clips by its own shard's norm). A norm made global by hand is not reported:
one passed through `torch.distributed.all_reduce` or `broadcast` in place since (a max norm), or
a new value combined from the local norms with a collective.
""",
)
