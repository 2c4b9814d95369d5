"""The guard on hand-written sharded loops (2 gloo processes, raise mode): a correct FSDP2 loop
with DTensor parameters reports nothing; a loop that reduce-scatters every micro-step is ACL401;
a GradScaler whose ranks disagree on a skip is ACL405."""

from __future__ import annotations

import fsdp_cases
import pytest
from fsdp_reference import UNITS

N, STEPS = 2, 2


@pytest.mark.parametrize("fp16", [False, True])
def test_a_correct_fsdp2_loop_reports_nothing(fsdp_pool, fp16):
    """Every installed check sees DTensor parameters and gradients: no crash, no finding."""
    results = fsdp_pool.run(fsdp_cases.raw_fsdp2_loop, sync_off=True, fp16=fp16, n=N, steps=STEPS)
    for rank in results:
        assert rank["findings"] == []
        assert rank["reduce_scatters"] == STEPS * UNITS
    assert results[0]["norms"] == results[1]["norms"]  # torch's clip saw the global norm


def test_reduce_scattering_every_micro_step_is_acl401(fsdp_pool):
    results = fsdp_pool.run(fsdp_cases.raw_fsdp2_loop, sync_off=False, fp16=False, n=N, steps=STEPS)
    for rank in results:
        assert rank["reduce_scatters"] == N * STEPS * UNITS  # what the guard counted from
        [(code, level, message)] = rank["findings"]
        assert (code, level) == ("ACL401", "warning")
        assert message.startswith(
            f"{N} backward passes of this optimizer step reduce-scattered a sharded model's "
            "gradients; only the last micro-batch needs to: call "
            "model.set_requires_gradient_sync(False)"
        )


def test_fsdp1_with_torch_gradscaler_disagreeing_on_a_skip_is_acl405(fsdp_pool):
    results = fsdp_pool.run(fsdp_cases.scaler_with_a_one_rank_overflow, kind="fsdp1-amp")
    assert [rank["stepped"] for rank in results] == [True, False]  # the divergence is real
    for rank, here in zip(results, ("stepped", "skipped the step"), strict=True):
        assert rank["raised"] is not None
        assert (
            "ACL405 the GradScaler skipped this step on some ranks and stepped on others"
            in (rank["raised"])
        )
        assert f"(this rank {here})" in rank["raised"]
        assert "ShardedGradScaler" in rank["raised"]


@pytest.mark.parametrize("kind", ["fsdp1-sharded", "fsdp2-amp"])
def test_scalers_that_agree_on_the_skip_report_nothing(fsdp_pool, kind):
    results = fsdp_pool.run(fsdp_cases.scaler_with_a_one_rank_overflow, kind=kind)
    for rank in results:
        assert rank["stepped"] is False  # every rank skipped the overflowing step
        assert rank["raised"] is None
        assert rank["findings"] == []
