"""guard.Engine(fsdp_plugin=...) on 2 gloo processes (CPU): FSDP2 sharding, one reduce-scatter
per optimizer step and unit, parity with one large batch, fp16 skips, DCP resume."""

from __future__ import annotations

import fsdp_cases
import pytest
import torch
from fsdp_reference import UNITS, large_batch, make_data, rel_err

W, N, B = 2, 4, 4
STEPS = 2
SAMPLES = STEPS * W * N * B


@pytest.fixture(scope="module")
def fp32_sgd(fsdp_pool):
    kwargs = dict(opt_kind="sgd", clip=None, samples=SAMPLES, batch_size=B, n=N)
    return fsdp_pool.run(fsdp_cases.engine_train, precision="no", **kwargs)


def test_parameters_are_sharded_dtensors_and_the_loop_is_clean(fp32_sgd):
    for rank in fp32_sgd:
        assert rank["world"] == W
        assert set(rank["sharded"]) == {"DTensor"}
        assert rank["findings"] == []  # the guard, installed in raise mode, saw nothing wrong


def test_one_reduce_scatter_per_optimizer_step_and_unit(fp32_sgd):
    for rank in fp32_sgd:
        assert rank["optimizer_steps"] == STEPS
        assert rank["reduce_scatters"] == STEPS * UNITS  # not N * STEPS * UNITS


@pytest.mark.parametrize("opt_kind, clip", [("sgd", None), ("adamw", 0.05)])
def test_ranks_equal_the_large_batch_reference_fp32(fsdp_pool, fp32_sgd, opt_kind, clip):
    if opt_kind == "sgd":
        results = fp32_sgd
    else:
        kwargs = dict(opt_kind=opt_kind, clip=clip, samples=SAMPLES, batch_size=B, n=N)
        results = fsdp_pool.run(fsdp_cases.engine_train, precision="no", **kwargs)
    assert torch.equal(results[0]["params"], results[1]["params"])
    x, y = make_data(SAMPLES)
    want, norms = large_batch(x, y, STEPS, W * N * B, opt_kind, clip)
    assert rel_err(results[0]["params"], want) <= 1e-6
    for rank in results:  # the clip saw the global norm, on both ranks
        assert rank["norms"] == pytest.approx(norms, rel=1e-5)
        assert rank["findings"] == []


def test_bf16_parameters_within_bf16_tolerance_of_the_fp32_reference(fsdp_pool):
    kwargs = dict(opt_kind="adamw", clip=0.05, samples=SAMPLES, batch_size=B, n=N)
    results = fsdp_pool.run(fsdp_cases.engine_train, precision="bf16", **kwargs)
    assert torch.equal(results[0]["params"], results[1]["params"])
    x, y = make_data(SAMPLES)
    want, _ = large_batch(x, y, STEPS, W * N * B, "adamw", 0.05)
    # bf16 compute (8 mantissa bits) for 2 AdamW steps of lr 1e-2 on weights of size ~0.3
    assert 0 < rel_err(results[0]["params"], want) <= 1e-2
    assert all(rank["reduce_scatters"] == STEPS * UNITS for rank in results)


def test_fp16_overflowing_first_step_is_skipped_on_both_ranks(fsdp_pool):
    """A loss scale of 2**20 overflows the fp16 gradients (the largest fp16 is 65504): the first
    step is skipped on every rank, the scale backs off, and later steps train; ranks stay equal."""
    kwargs = dict(opt_kind="sgd", clip=1.0, samples=2 * SAMPLES, batch_size=B, n=N)
    results = fsdp_pool.run(fsdp_cases.engine_train, precision="fp16", init_scale=2.0**20, **kwargs)
    assert torch.equal(results[0]["params"], results[1]["params"])
    for rank in results:
        skipped = 2 * STEPS - rank["optimizer_steps"]
        assert 1 <= skipped < 2 * STEPS, rank["optimizer_steps"]
        assert rank["scale"] == 2.0 ** (20 - skipped)  # backed off once per skipped step
        assert rank["findings"] == []


def test_ddp_fp16_skipped_windows_are_not_counted_into_the_next_one(fsdp_pool):
    """The same overflow under the DDP engine: a skipped step ends its window for ACL401 too
    (its all-reduce is not added to the next window's)."""
    kwargs = dict(samples=2 * SAMPLES, batch_size=B, n=N, init_scale=2.0**20)
    results = fsdp_pool.run(fsdp_cases.engine_ddp_train, precision="fp16", **kwargs)
    for rank in results:
        assert 1 <= rank["optimizer_steps"] < 2 * STEPS
        assert rank["findings"] == []


def test_tail_window_matches_the_ddp_engine(fsdp_pool):
    """17 global batches: windows 4, 4, 1 (the last one padded from the epoch's start)."""
    kwargs = dict(samples=17 * B, batch_size=B, n=N, tail="exact")
    fsdp = fsdp_pool.run(
        fsdp_cases.engine_train, precision="no", opt_kind="sgd", clip=None, **kwargs
    )
    ddp = fsdp_pool.run(fsdp_cases.engine_ddp_train, precision="no", **kwargs)
    for rank in fsdp:
        assert rank["optimizer_steps"] == 3
        assert rank["reduce_scatters"] == 3 * UNITS
    assert torch.equal(fsdp[0]["params"], fsdp[1]["params"])
    assert rel_err(fsdp[0]["params"], ddp[0]["params"]) <= 1e-6


def test_num_items_matches_the_ddp_engine(fsdp_pool):
    fsdp = fsdp_pool.run(fsdp_cases.engine_items, n=2, steps=2, fsdp=True)
    ddp = fsdp_pool.run(fsdp_cases.engine_items, n=2, steps=2, fsdp=False)
    assert [rank["reduce_scatters"] for rank in fsdp] == [2 * UNITS, 2 * UNITS]
    assert torch.equal(fsdp[0]["params"], fsdp[1]["params"])
    assert rel_err(fsdp[0]["params"], ddp[0]["params"]) <= 1e-6


@pytest.mark.parametrize("noisy", [False, True], ids=["plain", "dropout+shuffle"])
def test_resume_from_a_sharded_checkpoint_is_exact(fsdp_pool, tmp_path, noisy):
    """Mid-epoch: with dropout and a shuffled loader the continued run is exact only because
    each rank's generators and its pass's order were saved beside the shards."""
    results = fsdp_pool.run(
        fsdp_cases.engine_resume,
        directory=str(tmp_path / "ckpt"),
        samples=2 * SAMPLES,
        batch_size=B,
        n=N,
        cut=STEPS,
        noisy=noisy,
    )
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",  # one shard file per rank
        "guard_engine_0.pt",  # and per rank, what is no shard: its loaders' pass order
        "guard_engine_1.pt",
        "random_states_0.pkl",  # and its generators (dropout, Python, numpy)
        "random_states_1.pkl",
    ]
    for rank in results:
        assert rank["saved_steps"] == STEPS
        assert rank["straight_steps"] == rank["resumed_steps"] == 2 * STEPS
        assert rank["straight_lr"] == rank["resumed_lr"]
        assert torch.equal(rank["straight"], rank["resumed"])
        assert rank["findings"] == []


def test_saving_mid_window_is_refused(fsdp_pool, tmp_path):
    messages = fsdp_pool.run(fsdp_cases.engine_mid_window_save, directory=str(tmp_path / "c"))
    for message in messages:
        assert message is not None and "middle of an accumulation window" in message
