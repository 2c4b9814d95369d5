"""ACL602 precision-silently-ignored: a requested mixed precision that is not applied."""

from rules._base import Rule

RULE = Rule(
    code="ACL602",
    name="precision-silently-ignored",
    summary="the requested mixed precision is not applied (fp16 on CPU trains in fp32)",
    severity="warning",
    fix="none",
    runtime="full",
    static=False,
    docs="""\
## What it does
Runtime only; the linter has no static check. After `prepare`, the guard compares the precision
that was requested with the one actually in effect. A literal `cpu=True` combined with
`mixed_precision="fp16"` is the typical cause.

## Why is this bad?
`Accelerator(cpu=True, mixed_precision="fp16")` still reports `accelerator.mixed_precision` as
`"fp16"`, but on a CPU device it creates no scaler and does not wrap the forward in autocast, so
the run is plain fp32. Speed, memory and numerics differ from what the configuration claims, and
CPU tests of an "fp16" pipeline never exercise fp16. bf16 on CPU is applied normally. It is a
warning because the run itself trains correctly, only not in the precision it claims.

## Example
```python
accelerator = Accelerator(cpu=True, mixed_precision="fp16")
model = accelerator.prepare(model)
assert accelerator.mixed_precision == "fp16"       # passes, yet the forward runs in fp32
```

## Use instead
```python
accelerator = Accelerator(cpu=True, mixed_precision="bf16")   # CPU autocast is applied
model = accelerator.prepare(model)
```

## Fix safety
No autofix: the linter has no static check, and whether to switch to bf16 or to run on a GPU is
the user's choice.

## At runtime
After `prepare`, a requested fp16/bf16 with `accelerator.native_amp` false, a prepared model whose
forward was not wrapped, or a forward pre-hook that finds autocast off inside the engine's wrapper
gives ACL602, naming the effective precision. The guard engine itself never reports a precision it
does not apply.
""",
)
