"""ACL107: trainable fp16 parameters under a GradScaler, or low-precision gradient accumulation.

fp16 gradients make `unscale_` fail (reported before torch's ValueError); accumulating K > 1
micro-batches into fp16/bf16 `.grad` loses low-order bits at every addition (a warning).
"""

from __future__ import annotations

import torch

from guard.checks._common import report, trainable_dtypes

CODES = ("ACL107",)
_LOW = (torch.float16, torch.bfloat16)


def install(tracker) -> None:
    tracker.subscribe("unscale_pre", _before_unscale_or_step)
    tracker.subscribe("scaler_step_pre", _before_unscale_or_step)
    # a warning about how the model was built: the sampled steps (the first 8, then every 16th)
    # see it, the others need not pay for the dtype scan
    tracker.subscribe("optimizer_step_pre", _before_step, sampled=True)
    tracker.subscribe("prepare", _after_prepare)


def _before_unscale_or_step(optimizer, state, **_) -> None:
    if not state.unscaled and torch.float16 in trainable_dtypes(optimizer):
        report(
            "ACL107",
            "the GradScaler is about to unscale fp16 parameters' gradients (torch raises "
            "'Attempting to unscale FP16 gradients'); keep the trainable weights in fp32 and let "
            "autocast run the fp16 math",
        )


def _before_step(optimizer, state, **_) -> None:
    low = [d for d in _LOW if d in trainable_dtypes(optimizer)]
    if low and state.backwards > 1:
        report(
            "ACL107",
            f"{state.backwards} micro-batches were accumulated into {low[0]} gradients before "
            "this step: each addition rounds away low-order bits; keep trainable weights in fp32 "
            "(autocast for the math) or accumulate in an fp32 buffer",
            "warning",
        )


def _after_prepare(accelerator, outputs, **_) -> None:
    modules = [m for m in outputs if isinstance(m, torch.nn.Module)]
    dtypes = {p.dtype for m in modules for p in m.parameters() if p.requires_grad}
    if getattr(accelerator, "scaler", None) is not None and torch.float16 in dtypes:
        report(
            "ACL107",
            "a model with trainable fp16 parameters was prepared for fp16 training: the scaler's "
            "unscale_ will fail; load the model in fp32 (autocast does the fp16 math)",
        )
    elif getattr(accelerator, "gradient_accumulation_steps", 1) > 1 and dtypes & set(_LOW):
        report(
            "ACL107",
            f"trainable {sorted(map(str, dtypes & set(_LOW)))[0]} parameters with "
            f"gradient_accumulation_steps={accelerator.gradient_accumulation_steps}: gradients "
            "accumulate in low precision; keep trainable weights in fp32",
            "warning",
        )


def engine_parameters(model: torch.nn.Module, scaled: bool, n: int) -> None:
    """The engine's case, at prepare: trainable fp16 parameters under its scaler, or
    low-precision gradient sums (K > 1)."""
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if scaled and torch.float16 in dtypes:
        report(
            "ACL107",
            "the model has trainable fp16 parameters and the engine uses fp16 loss scaling: "
            "GradScaler cannot unscale fp16 gradients; keep the weights in fp32 (autocast does "
            "the fp16 math)",
        )
    low = sorted(str(d).removeprefix("torch.") for d in dtypes & {torch.float16, torch.bfloat16})
    if n > 1 and low:
        report(
            "ACL107",
            f"trainable {'/'.join(low)} parameters with {n}-step accumulation: every micro-step "
            "adds into a low-precision .grad and loses low-order bits; keep the weights in fp32",
            "warning",
        )
