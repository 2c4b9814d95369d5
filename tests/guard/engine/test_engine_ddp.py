"""DDP on 2 CPU processes (gloo): no_sync on non-sync micro-steps, parity with one large batch."""

from __future__ import annotations

import ddp_cases
import pytest
import torch
from engine_reference import (
    flat_params,
    large_batch_run,
    make_data,
    make_token_batches,
    make_token_model,
    rel_err,
    token_reference,
)

W, N, B = 2, 4, 4


@pytest.mark.parametrize("opt_kind, clip", [("sgd", None), ("adamw", 0.05)])
def test_one_allreduce_per_step_identical_ranks_equal_large_batch(ddp_pool, opt_kind, clip):
    """16 global batches: each rank runs 8 micro-steps, i.e. 2 optimizer steps of 2·N·B samples."""
    results = ddp_pool.run(
        ddp_cases.accumulate_with_no_sync,
        samples=16 * B,
        batch_size=B,
        n=N,
        opt_kind=opt_kind,
        clip=clip,
    )
    assert [r["world"] for r in results] == [W, W]
    for r in results:
        assert r["allreduces"] == r["optimizer_steps"] == 2
        assert r["forward_sync_flags"] == [False, False, False, True] * 2
        assert r["scheduler_steps"] == W * 2  # W scheduler steps per optimizer step
    assert torch.equal(results[0]["params"], results[1]["params"])
    x, y = make_data(16 * B)
    want = large_batch_run(x, y, [W * N] * 2, B, opt_kind, clip, sched_steps=W)
    assert rel_err(results[0]["params"], want) <= 1e-6


def test_uneven_global_tail_is_padded_and_flushed(ddp_pool):
    """17 global batches: rank 1's 9th batch repeats samples from the start; windows 4,4,1."""
    results = ddp_pool.run(
        ddp_cases.accumulate_with_no_sync,
        samples=17 * B,
        batch_size=B,
        n=N,
        opt_kind="sgd",
        clip=None,
    )
    for r in results:
        assert r["optimizer_steps"] == r["allreduces"] == 3
        assert r["forward_sync_flags"] == [False, False, False, True] * 2 + [True]
    assert torch.equal(results[0]["params"], results[1]["params"])


def test_split_batches_steps_the_scheduler_once(ddp_pool):
    case = ddp_cases.scheduler_with_split_batches
    results = ddp_pool.run(case, samples=16 * B, batch_size=B, n=N)
    assert results == [2, 2]


def test_num_items_is_exact_across_ranks_and_window(ddp_pool):
    steps = 2
    want = token_reference(make_token_batches(W * N * steps), steps, W * N)
    exact = ddp_pool.run(ddp_cases.token_items, n=N, steps=steps, use_items=True)
    biased = ddp_pool.run(ddp_cases.token_items, n=N, steps=steps, use_items=False)
    start = flat_params(make_token_model())
    assert torch.equal(exact[0], exact[1])
    assert rel_err(exact[0], want) <= 1e-6
    assert rel_err(exact[0] - start, want - start) <= 1e-5
    assert rel_err(biased[0] - start, want - start) > 0.05  # the sum-of-means error is real


def test_gather_for_metrics_drops_the_padding(ddp_pool):
    """10 samples, batch 2, 2 ranks: the last global batch holds 2 real samples and 2 repeats."""
    results = ddp_pool.run(ddp_cases.gather_metrics, samples=10, batch_size=2)
    plain, for_metrics, _ = results[0]
    assert len(plain) == 12
    assert sorted(for_metrics.tolist()) == [float(v) for v in range(10)]
    local = [r[2] for r in results]
    assert len(local[0]) == len(local[1]) == 6


@pytest.mark.parametrize(
    "n, divisor, expected",
    [(1, W, ["ACL402"]), (N, N * W, ["ACL302", "ACL402"]), (N, N, ["ACL302"]), (1, 3, [])],
)
def test_acl402_loss_divided_by_world_size(ddp_pool, n, divisor, expected):
    assert ddp_pool.run(ddp_cases.divided_by_world, n=n, divisor=divisor) == [expected] * W


def test_engine_no_sync_skips_the_allreduce(ddp_pool):
    results = ddp_pool.run(ddp_cases.explicit_no_sync)
    assert [(r["inside"], r["after"]) for r in results] == [(0, 1), (0, 1)]
    # ranks saw different data: local gradients differ, synced ones agree
    assert not torch.equal(results[0]["local"][0], results[1]["local"][0])
    for a, b in zip(results[0]["synced"], results[1]["synced"], strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-7)


def test_acl308_sees_token_counts_of_all_ranks(ddp_pool):
    """Only the cross-rank gather reveals this bias: each rank alone is uniform."""
    assert ddp_pool.run(ddp_cases.token_counts_differ_across_ranks) == [["ACL308"]] * W


def test_acl308_gather_pairs_up_when_one_rank_saw_no_token_mean(ddp_pool):
    results = ddp_pool.run(ddp_cases.token_mean_on_one_rank_only)
    assert results == [{"ranks": [0.0, 1.0], "found": []}] * W


def test_a_user_wrapped_ddp_model_is_kept_and_accumulated(ddp_pool):
    results = ddp_pool.run(ddp_cases.user_wrapped_ddp, n=N)
    assert results == [{"same_object": True, "allreduces": 1}] * W
