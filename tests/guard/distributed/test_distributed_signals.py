"""ACL308, ACL309 and ACL403 across 2 gloo processes (CPU), in raise mode: token counts gathered
over ranks, DDP models that disagree on gradient sync, and samples gathered per evaluation pass.

One subprocess runs every case on both ranks (starting a process group costs seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests/guard, for the two-rank runner
from dist_worker import N, padded_total  # noqa: E402
from two_ranks import run_two_ranks  # noqa: E402

W = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    results = tmp_path_factory.mktemp("dist-results")
    worker = HERE / "dist_worker.py"
    return run_two_ranks(worker, results, env={"ACCEL_DIST_RESULTS": str(results)})


def _expected_token_bias(per_rank_lengths: list[list[int]]) -> tuple[int, float, float, float]:
    """The window's micro-batch count, shortest, longest and bias over all ranks (2 sequences
    per micro-batch, each with `length` valid tokens)."""
    tokens = [2 * length for lengths in per_rank_lengths for length in lengths]
    mean = sum(tokens) / len(tokens)
    bias = max(abs(mean / t - 1) for t in tokens)
    return len(tokens), min(tokens), max(tokens), bias


# -- ACL308 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["acl308_raw", "acl308_accelerate"])
def test_acl308_bias_is_measured_over_the_ranks_and_reported_alike(ranks, case):
    """Rank 0's micro-batches are short, rank 1's long: each rank alone is unbiased."""
    n, shortest, longest, bias = _expected_token_bias([[1] * N, [8] * N])
    assert _expected_token_bias([[1] * N])[3] == 0  # a rank-local count would see nothing
    messages = []
    for rank in ranks:
        [(code, level, message)] = rank[case]
        assert (code, level) == ("ACL308", "warning")
        messages.append(message)
    assert messages[0] == messages[1]
    assert messages[0].startswith(
        f"{n} micro-batches (all {W} ranks) with {shortest:g} to {longest:g} valid tokens"
    )
    assert f"weighs {longest / shortest:.1f}x" in messages[0]
    assert f"(bias {bias:.0%})" in messages[0]


@pytest.mark.parametrize("case", ["acl308_raw_equal", "acl308_raw_sum", "acl308_one_rank"])
def test_acl308_silent_for_equal_counts_token_sums_and_a_rank_without_token_means(ranks, case):
    """The one-rank case also shows that the per-step gather pairs up (no deadlock) when only
    rank 0 saw a token-mean loss."""
    assert [rank[case] for rank in ranks] == [[], []]


# -- ACL309 ----------------------------------------------------------------------------------------


def test_acl309_tower_left_out_of_accumulate_warns_it_syncs_every_micro_step(ranks):
    """Correct numbers, N-fold communication: a warning, so raise mode trains on."""
    for rank in ranks:
        result = rank["acl309_one_tower"]
        assert result["raised"] is None
        assert result["replicas_equal"]
        by_code = {code: (level, message) for code, level, message in result["findings"]}
        # tower_b's every-micro-step all-reduce is also ACL401's signal: reported once, as ACL309
        assert sorted(by_code) == ["ACL309"]
        level, message = by_code["ACL309"]
        assert level == "warning"
        assert (  # tower_a entered accumulate(), tower_b was left out
            "disagree on gradient sync: model 1 (Linear) waits under no_sync(), "
            "model 2 (Sequential) all-reduces in its backward (in call order; K=2): a model "
            "left out of accelerator.accumulate() all-reduces on every micro-step"
        ) in message


def test_acl401_still_reports_a_tower_left_out_when_acl309_is_ignored(ranks):
    for rank in ranks:
        result = rank["acl309_ignored_one_tower"]
        assert [code for code, _level, _message in result["findings"]] == ["ACL401"]


def test_acl309_tower_waiting_on_the_sync_step_raises_before_its_backward(ranks):
    for rank in ranks:
        result = rank["acl309_one_tower_no_sync"]
        assert result["raised"] == "ACL309"
        assert (
            "model 1 (Linear) all-reduces in its backward, model 2 (Sequential) waits under "
            "no_sync() (in call order; K=2): this is the update step"
        ) in result["message"]
        assert result["before_backward"] is False  # the first window's micro-step ran
        assert result["params_unchanged"]  # ... but no optimizer step applied it
        assert "dist_worker.py:" in result["message"]  # the user's line


def test_acl309_one_entry_with_both_towers_is_clean_and_replicas_agree(ranks):
    for rank in ranks:
        result = rank["acl309_both_towers"]
        assert result["raised"] is None
        assert result["findings"] == []
        assert result["replicas_equal"]


# -- ACL403 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["pair", "separate"])
def test_acl403_gather_over_a_padded_pass_reports_the_counted_samples(ranks, how):
    samples, batch = 50, 8
    kept = padded_total(samples, batch, W)
    for rank in ranks:
        result = rank["acl403"][f"{how}_{samples}"]
        assert result["seen"] == kept > samples  # the loop really saw the padding
        print(result["findings"])
        [(code, level, message)] = result["findings"]
        assert (code, level) == ("ACL403", "warning")
        assert message.startswith(
            f"this evaluation pass gathered {kept} samples for a dataset "
            f"of {samples}: the last batch carries {kept - samples} repeated"
        )


@pytest.mark.parametrize(
    "key", ["for_metrics_50", "loss_50", "pair_48", "separate_48", "for_metrics_48", "loss_48"]
)
def test_acl403_silent_for_gather_for_metrics_scalars_and_no_remainder(ranks, key):
    samples = int(key.rsplit("_", 1)[1])
    for rank in ranks:
        result = rank["acl403"][key]
        assert result["findings"] == []
        if not key.startswith("loss"):
            assert result["seen"] == samples  # the oracle: no padding reached the metric


def test_acl403_training_pass_gathering_losses_is_not_evaluation(ranks):
    assert [rank["acl403_train"] for rank in ranks] == [[], []]


@pytest.mark.parametrize("kind", ["tensors", "objects"])
def test_acl403_distributed_sampler_with_all_gather(ranks, kind):
    """51 samples on 2 ranks: the sampler pads one; 50 samples: none."""
    kept = -(-51 // W) * W  # DistributedSampler's total_size
    for rank in ranks:
        padded, exact = rank["acl403_sampler"][f"{kind}_51"], rank["acl403_sampler"][f"{kind}_50"]
        assert padded["gathered"] == kept
        [(code, level, message)] = padded["findings"]
        assert (code, level) == ("ACL403", "warning")
        assert f"gathered {kept} samples for a dataset of 51" in message
        assert exact == {"findings": [], "gathered": 50}
