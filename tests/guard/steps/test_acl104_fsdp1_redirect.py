"""ACL104 under FSDP1 (FullyShardedDataParallel, FULL_SHARD) on 2 gloo processes on CPU.

torch.nn.utils.clip_grad_norm_ on the model's parameters measures each rank's shard only; the
guard reports it and redirects the call to the model's own clip_grad_norm_. The oracle is the
same loop calling fsdp_model.clip_grad_norm_ itself: same returned norms, same parameters."""

from __future__ import annotations


def test_torch_clip_on_fsdp1_is_reported_and_returns_the_models_own_norm(two_ranks):
    for rank in two_ranks:
        [(code, level, count, message)] = rank["findings"]
        assert (code, level) == ("ACL104", "warning")
        assert count == len(rank["norms"]) == 2  # once per step, at one location
        assert "the guard called model.clip_grad_norm_(max_norm) instead" in message
        assert rank["norms"] == rank["oracle_norms"]
        assert rank["oracle_findings"] == []  # FSDP's own clip is clean under the guard


def test_the_redirected_loop_trains_exactly_like_the_oracle(two_ranks):
    for rank in two_ranks:
        assert rank["trained"] and rank["same_params"]


def test_the_shard_norms_really_differ_between_ranks(two_ranks):
    """What torch's clip would have used: each rank's shard norm, not the total."""
    first, second = (r["shard_norms"][0] for r in two_ranks)
    total = two_ranks[0]["oracle_norms"][0]
    assert first != second
    assert abs(total - (first**2 + second**2) ** 0.5) < 1e-5 * total  # FSDP's all-reduce


def test_clipping_part_of_an_fsdp1_model_raises_before_touching_gradients(two_ranks):
    for rank in two_ranks:
        subset = rank["subset"]
        assert subset["raised"] == "ACL104" and subset["grads_unchanged"]
        assert "on part of an FSDP model's parameters" in subset["message"]


def test_no_shard_fsdp1_clips_with_torch_unreported(two_ranks):
    """Must not flag: NO_SHARD ranks hold the full all-reduced gradients, so torch's clip on
    them measures the true norm (FSDP's own clip_grad_norm_ calls it too)."""
    for rank in two_ranks:
        no_shard = rank["no_shard"]
        assert no_shard["findings"] == []
        torch_norm, fsdp_norm = no_shard["norms"]
        assert torch_norm == fsdp_norm
    assert two_ranks[0]["no_shard"]["norms"] == two_ranks[1]["no_shard"]["norms"]
