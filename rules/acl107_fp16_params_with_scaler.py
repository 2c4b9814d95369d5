"""ACL107 fp16-params-with-scaler: trainable parameters stored in fp16 (bf16 with accumulation)."""

from rules._base import Rule

RULE = Rule(
    code="ACL107",
    name="fp16-params-with-scaler",
    summary="trainable fp16 parameters: the scaler rejects their grads, small updates round away",
    severity="error",
    fix="none",
    runtime="full",
    static=True,
    guard_levels=("error", "warning"),
    docs="""\
## What it does
Flags `.half()`, `.to(torch.float16)`, `.to(dtype=torch.float16)` or `torch_dtype=torch.float16`
on a model whose parameters reach a plain optimizer (torch, transformers, bitsandbytes or timm,
or a name bound to one) built in the same function (or `self.X` in the same class), in a module
with a GradScaler that may be enabled or an fp16 Accelerator / guard engine; and fp16 or bf16
casts (`.bfloat16()`, `torch_dtype=torch.bfloat16`, ...) of such a model when gradients
accumulate (an accumulation value other than the literal 1). The outermost cast of a chain
counts (`.half().float()` is fp32). Models frozen with `requires_grad_(False)` or a loop that
turns `requires_grad` off, adapter wrappers (`get_peft_model`), casts after the training loop
(evaluation, export), optimizers that may keep fp32 master weights (apex, a project's own),
`torch_dtype="auto"` and dtypes taken from a variable are left to the runtime check.

## Why is this bad?
fp16 parameters get fp16 gradients, and `GradScaler.unscale_` rejects them
(`ValueError: Attempting to unscale FP16 gradients.`) at the first clip or step. Without a scaler
the run goes on, but updates smaller than about 2^-11 of a weight round away, and adding K
micro-batch gradients into an fp16 or bf16 `.grad` loses low-order bits at every addition (bf16
keeps only 8 significant bits), so precision loss grows with K.
The first case is an error (the run stops at its first step); low-precision accumulation is a
warning (precision is lost gradually, the run goes on).

## Example
```python
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)
accelerator = Accelerator(mixed_precision="fp16")
model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
```

## Use instead
```python
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float32)
accelerator = Accelerator(mixed_precision="fp16")     # autocast does the fp16 math
model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
```

## Fix safety
No autofix: the cure is in how the model is loaded, and fp32 master weights change memory use.

## At runtime
At `prepare`, a parameter that requires grad and is float16 while the scaler is enabled raises
ACL107; trainable fp16/bf16 parameters with K > 1 give a warning.
""",
)
