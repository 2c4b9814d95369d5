"""Accelerate names `guard.Engine` deliberately leaves out, each with what to use instead.

A script written for Accelerate that reaches for DeepSpeed, Megatron-LM, FP8, TPU or Accelerate's
N-D parallelism gets a `NotImplementedError` naming the feature and the alternative, never a bare
AttributeError. Names that only *ask* whether such a feature is configured (`deepspeed_plugin`,
`fp8_recipe_handler`, ...) answer None, Accelerate's own answer when it is not configured.
"""

from __future__ import annotations

from typing import Any

_DEEPSPEED = (
    "DeepSpeed is not supported by guard.Engine: keep Accelerator(deepspeed_plugin=...) for "
    "ZeRO, or use guard.Engine with DDP (and torch FSDP2 where the engine offers it)"
)
_MEGATRON = (
    "Megatron-LM is not supported by guard.Engine: keep Accelerator(megatron_lm_plugin=...) "
    "for tensor/pipeline parallel Megatron models"
)
_FP8 = (
    "FP8 training is not supported by guard.Engine: use mixed_precision='bf16' (or 'fp16'), "
    "or keep Accelerator(mixed_precision='fp8') with Transformer Engine / torchao"
)
_TPU = (
    "TPU/XLA is not supported by guard.Engine: keep Accelerator on TPU; the engine runs on "
    "CPU and CUDA (DDP over gloo or nccl)"
)
_PARALLELISM = (
    "Accelerate's N-D parallelism (tensor/context/sequence parallel, device meshes) is not "
    "supported by guard.Engine: keep Accelerator(parallelism_config=...) for it"
)

# Methods and attributes that do the unsupported thing: calling or reading them raises.
UNSUPPORTED_NAMES: dict[str, str] = {
    "deepspeed_engine_wrapped": _DEEPSPEED,
    "deepspeed_config": _DEEPSPEED,
    "deepspeed_plugins": _DEEPSPEED,
    "deepspeed_ulysses_dl_adapter": _DEEPSPEED,
    "lomo_backward": _DEEPSPEED,
    "fp8_backend": _FP8,
    "fp8_enabled": _FP8,
    "maybe_context_parallel": _PARALLELISM,
    "tensor_parallel_rank": _PARALLELISM,
    "pipeline_parallel_rank": _PARALLELISM,
    "context_parallel_rank": _PARALLELISM,
    "data_parallel_rank": _PARALLELISM,
    "data_parallel_shard_rank": _PARALLELISM,
    "join_uneven_inputs": (
        "join_uneven_inputs is not supported by guard.Engine: prepared loaders give every rank "
        "the same number of batches (even_batches), so no Join context is needed"
    ),
}

# Queries whose honest answer for this engine is "not configured".
NOT_CONFIGURED: dict[str, Any] = {
    "deepspeed_plugin": None,
    "fp8_recipe_handler": None,
    "parallelism_config": None,
    "torch_device_mesh": None,
}

# Constructor arguments of Accelerator that select an unsupported feature.
UNSUPPORTED_OPTIONS: dict[str, str] = {
    "deepspeed_plugin": _DEEPSPEED,
    "deepspeed_plugins": _DEEPSPEED,
    "megatron_lm_plugin": _MEGATRON,
    "parallelism_config": _PARALLELISM,
    "torch_tp_plugin": _PARALLELISM,
}


def unsupported_option(name: str, value: Any) -> None:
    """Raise for an Accelerator(...) argument that selects a feature the engine does not have."""
    if value is not None and name in UNSUPPORTED_OPTIONS:
        raise NotImplementedError(UNSUPPORTED_OPTIONS[name])


class UnsupportedPrecision(NotImplementedError, ValueError):
    """mixed_precision='fp8': not implemented here, and a bad value for this engine (so code
    that caught the engine's ValueError for unknown precisions still catches it)."""


def fp8_precision() -> NotImplementedError:
    return UnsupportedPrecision(_FP8)


def tpu_device() -> NotImplementedError:
    return NotImplementedError(_TPU)


class UnsupportedNames:
    """`Engine.__getattr__` for the documented unsupported names (all others: AttributeError)."""

    def __getattr__(self, name: str) -> Any:
        if name in UNSUPPORTED_NAMES:
            raise NotImplementedError(UNSUPPORTED_NAMES[name])
        if name in NOT_CONFIGURED:
            return NOT_CONFIGURED[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
