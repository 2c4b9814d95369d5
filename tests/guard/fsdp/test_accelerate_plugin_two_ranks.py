"""guard.Engine(fsdp_plugin=accelerate.FullyShardedDataParallelPlugin(fsdp_version=2, ...)) on 2
gloo processes: the plugin's wrap policy picks the FSDP2 units, each reduce-scatters once per
optimizer step, and both ranks end equal to the single-process large-batch reference.

Accelerate's own Accelerator is no oracle here: on CPU (DistributedType.MULTI_CPU) it ignores
the FSDP plugin and wraps the model in DDP; it shards only on GPU-like devices."""

from __future__ import annotations

import fsdp_cases
import pytest
import torch
from fsdp_reference import large_batch, make_data, rel_err

W, N, B, STEPS = 2, 2, 4, 2
SAMPLES = STEPS * W * N * B


def run(fsdp_pool, precision: str, **plugin_fields) -> list:
    kwargs = dict(opt_kind="adamw", clip=0.05, samples=SAMPLES, batch_size=B, n=N)
    return fsdp_pool.run(
        fsdp_cases.accelerate_plugin_train,
        plugin_fields=plugin_fields,
        precision=precision,
        **kwargs,
    )


def test_size_based_wrap_equals_the_large_batch_reference_fp32(fsdp_pool):
    # inp (112 parameters) and each block (272) are over 100; the head (51) stays in the root
    results = run(
        fsdp_pool,
        "no",
        auto_wrap_policy="size_based_wrap",
        min_num_params=100,
        reshard_after_forward=False,
    )
    x, y = make_data(SAMPLES)
    want, norms = large_batch(x, y, STEPS, W * N * B, "adamw", 0.05)
    assert torch.equal(results[0]["params"], results[1]["params"])
    assert rel_err(results[0]["params"], want) <= 1e-6
    for rank in results:
        assert rank["world"] == W and set(rank["sharded"]) == {"DTensor"}
        assert rank["units"] == ["", "inp", "blocks.0", "blocks.1"]
        assert rank["reduce_scatters"] == STEPS * 4  # once per optimizer step and unit
        assert rank["norms"] == pytest.approx(norms, rel=1e-5)
        assert rank["findings"] == []


def test_transformer_based_wrap_with_its_bf16_policy_tracks_the_reference(fsdp_pool):
    results = run(
        fsdp_pool,
        "bf16",
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Linear"],
        mixed_precision_policy="bf16",
    )
    x, y = make_data(SAMPLES)
    want, _ = large_batch(x, y, STEPS, W * N * B, "adamw", 0.05)
    assert torch.equal(results[0]["params"], results[1]["params"])
    # bf16 parameters and gradient reduction (Accelerate's "bf16" policy) for 2 AdamW steps
    assert 0 < rel_err(results[0]["params"], want) <= 1e-2
    for rank in results:
        assert rank["units"] == ["", "inp", "blocks.0", "blocks.1", "out"]
        assert rank["reduce_scatters"] == STEPS * 4  # the root holds no parameters of its own
        assert rank["findings"] == []
