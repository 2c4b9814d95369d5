"""ACL203 deprecated-amp-api: the deprecated `torch.cuda.amp` / `torch.cpu.amp` aliases."""

from rules._base import Rule

RULE = Rule(
    code="ACL203",
    name="deprecated-amp-api",
    summary="deprecated `torch.cuda.amp` / `torch.cpu.amp` API: use `torch.amp` with a device type",
    severity="warning",
    fix="safe",
    runtime="warning",
    static=True,
    docs="""\
## What it does
Flags `torch.cuda.amp.autocast`, `torch.cuda.amp.GradScaler`, `torch.cuda.amp.custom_fwd` /
`custom_bwd`, `torch.cpu.amp.autocast` and `torch.cpu.amp.GradScaler`, however they are reached:
a full attribute chain (`torch.cuda.amp.autocast(...)`, also through `import torch as th`) is
reported where it is written; a name imported from the deprecated modules
(`from torch.cuda.amp import autocast as ac`, `import torch.cuda.amp as amp`,
`from torch.cuda import amp`) is reported once, at its import, with the lines that use it. An
import of two deprecated names gives one finding per name, and one fix for both. References
inside compatibility fallbacks (an `ImportError` / `AttributeError` handler, a branch that tests
the torch version or `hasattr(...)`, the code after `if hasattr(...): return ...`) are left
alone, as are mentions in strings and comments and assignments that patch the attribute.

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
import torch
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
`device_type="cuda"`. Imported names are rewritten at every use in the module and their import
is removed (`import torch` takes its place when nothing else binds `torch` there); a deprecated
module alias is pointed at `torch.amp` instead. The fix is skipped, and the message says why,
when a name escapes (re-exported, used as a value rather than called, bound to something else
too, or imported as a feature probe inside `try`), and for `*args` calls of autocast.

## At runtime
Warning only: when the user's code (not a library) constructs `torch.cuda.amp.GradScaler`,
`torch.cuda.amp.autocast`, `torch.cpu.amp.autocast` or `torch.cpu.amp.GradScaler` (the calls for
which torch emits its `FutureWarning`), the guard reports ACL203 once per call site, with the
`torch.amp` spelling.
""",
)
