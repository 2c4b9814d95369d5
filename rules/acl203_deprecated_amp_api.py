"""ACL203 deprecated-amp-api: the deprecated `torch.cuda.amp` / `torch.cpu.amp` aliases."""

from rules._base import Rule

RULE = Rule(
    code="ACL203",
    name="deprecated-amp-api",
    summary="deprecated `torch.cuda.amp` / `torch.cpu.amp` API: use `torch.amp` with a device type",
    severity="warning",
    fix="safe",
    runtime="warning",
    static=False,
    docs="""\
## What it does
Flags `torch.cuda.amp.autocast`, `torch.cuda.amp.GradScaler`, `torch.cuda.amp.custom_fwd` /
`custom_bwd` and `torch.cpu.amp.autocast`, as attributes or through
`from torch.cuda.amp import ...` / `from torch.cpu.amp import ...`. References inside
compatibility fallbacks (an `ImportError` / `AttributeError` handler, or a torch version check)
are left alone.

## Why is this bad?
These are deprecated aliases: each call emits a `FutureWarning`, and they are due to be removed.
The math is the same (CUDA autocast still defaults to float16), so the cost is log noise and a
future break. A plain rename is not enough, because the old and new autocast signatures take their
positional arguments in a different order.

## Example
```python
from torch.cuda.amp import GradScaler, autocast
scaler = GradScaler(2.0**14)
with autocast(use_amp):
    out = model(x)
```

## Use instead
```python
scaler = torch.amp.GradScaler("cuda", 2.0**14)
with torch.amp.autocast("cuda", enabled=use_amp):
    out = model(x)
```

## Fix safety
Safe. `torch.cuda.amp.autocast(a, b, c)` becomes
`torch.amp.autocast("cuda", enabled=a, dtype=b, cache_enabled=c)`: positional arguments always
become keywords, since the old order is `(enabled, dtype, cache_enabled)` and the new one starts
with `device_type`. `torch.cpu.amp.autocast` is handled the same way with `"cpu"`.
`torch.cuda.amp.GradScaler(...)` becomes `torch.amp.GradScaler("cuda", ...)` with its arguments
unchanged. `@torch.cuda.amp.custom_fwd(...)` / `custom_bwd` become the `torch.amp` decorators with
`device_type="cuda"`. Imported names are rewritten at every use in the module; if a name escapes
(re-exported or passed as a value) the fix is skipped.

## At runtime
Warning only: when the user's code (not a library) constructs `torch.cuda.amp.GradScaler`,
`torch.cuda.amp.autocast`, `torch.cpu.amp.autocast` or `torch.cpu.amp.GradScaler` (the calls for
which torch emits its `FutureWarning`), the guard reports ACL203 once per call site, with the
`torch.amp` spelling.
""",
)
