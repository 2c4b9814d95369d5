"""ACL104 under FSDP2 (2 gloo processes): a clip over the local shards of the DTensor parameters
or gradients is reported at the user's clip line on both ranks, and the harm is real (the
parameters leave the globally clipped reference); torch's clip over the DTensors, a norm made
global by hand, DDP and one process report nothing."""

from __future__ import annotations

import fsdp_clip_cases
import pytest
import torch
from fsdp_reference import large_batch, make_data, make_model, rel_err

W, B, STEPS = 2, 4, 3
CASES = fsdp_clip_cases.__file__


def clip_line(how: str) -> str:
    """`path:line` of the clip marked `# clip: <how>` in the cases module."""
    with open(CASES) as source:
        for number, line in enumerate(source, start=1):
            if line.rstrip().endswith(f"# clip: {how}"):
                return f"{CASES}:{number}"
    raise AssertionError(f"no clip marked {how}")


def reference(clip: float | None = fsdp_clip_cases.MAX_NORM):
    """One process, the global batch at once, torch's clip over the whole model."""
    x, y = make_data(STEPS * W * B)
    return large_batch(x, y, STEPS, W * B, "sgd", clip, gamma=1.0)


@pytest.mark.parametrize("how", ["dtensor", "dtensor-norm", "all-reduced"])
def test_clips_that_see_the_global_norm_report_nothing(fsdp_pool, how):
    results = fsdp_pool.run(fsdp_clip_cases.clip_loop, how=how, batch_size=B, steps=STEPS)
    want, norms = reference()
    for rank in results:
        assert rank["findings"] == []
        assert rank["norms"] == pytest.approx(norms, rel=1e-5)  # the global norm on every rank
        assert rel_err(rank["params"], want) <= 1e-6


def test_an_inf_norm_all_reduced_in_place_reports_nothing(fsdp_pool):
    """The norm get_total_norm returned, changed in place by the all-reduce: not a local one."""
    kwargs = dict(batch_size=B, steps=STEPS)
    by_hand = fsdp_pool.run(fsdp_clip_cases.clip_loop, how="inf-all-reduced", **kwargs)
    torch_clip = fsdp_pool.run(fsdp_clip_cases.clip_loop, how="dtensor-inf", **kwargs)
    for rank, want in zip(by_hand, torch_clip, strict=True):
        assert rank["findings"] == [] and want["findings"] == []
        assert rank["norms"] == want["norms"]
        assert torch.equal(rank["params"], want["params"])
    assert by_hand[0]["norms"][0] > fsdp_clip_cases.MAX_NORM  # the clip was active


def test_ddp_with_get_total_norm_reports_nothing(fsdp_pool):
    kwargs = dict(how="dtensor-norm", batch_size=B, steps=STEPS, sharded=False)
    results = fsdp_pool.run(fsdp_clip_cases.clip_loop, **kwargs)
    want, _ = reference()
    for rank in results:
        assert rank["findings"] == []
        assert rel_err(rank["params"], want) <= 1e-6


def test_clip_grad_norm_over_local_shards_clips_nothing_and_is_acl104(fsdp_pool):
    results = fsdp_pool.run(fsdp_clip_cases.clip_loop, how="to-local", batch_size=B, steps=STEPS)
    clipped, _ = reference()
    unclipped, _ = reference(clip=None)
    for rank in results:
        [(code, level, message, location)] = rank["findings"]  # once, for every step's clip
        assert (code, level, location) == ("ACL104", "error", clip_line("to-local"))
        assert message.startswith(
            "torch.nn.utils.clip_grad_norm_ over the local shards of FSDP2's DTensor parameters "
            "or gradients (to_local(), _local_tensor): a plain shard has no .grad, so nothing is "
            "measured or clipped (the norm is 0) on any rank; pass the DTensor parameters "
            "themselves: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)"
        )
        assert rank["norms"] == [0.0] * STEPS
        assert rel_err(rank["params"], clipped) > 0.03  # the harm: no step was clipped
        assert rel_err(rank["params"], unclipped) <= 1e-6


def test_clip_grad_value_over_local_tensors_is_acl104_before_torch_fails(fsdp_pool):
    for rank in fsdp_pool.run(fsdp_clip_cases.value_clip_over_local_tensors):
        assert rank["location"] == clip_line("local-tensor-value")
        problem, help_line = rank["raised"].split("\n")  # the guard's error: problem, then help
        assert problem.endswith(
            ": ACL104 torch.nn.utils.clip_grad_value_ over the local shards of FSDP2's DTensor "
            "parameters or gradients (to_local(), _local_tensor): a plain shard has no .grad, so "
            "nothing is clipped on any rank"
        )
        assert help_line.startswith(
            "help: pass the DTensor parameters themselves: "
            "torch.nn.utils.clip_grad_value_(model.parameters(), clip_value)"
        )


def test_a_per_rank_norm_passed_to_clip_grads_with_norm_is_acl104(fsdp_pool):
    results = fsdp_pool.run(fsdp_clip_cases.clip_loop, how="local-norm", batch_size=B, steps=STEPS)
    want, global_norms = reference()
    for rank in results:
        [(code, level, message, location)] = rank["findings"]
        assert (code, level, location) == ("ACL104", "error", clip_line("local-norm"))
        assert message.startswith(
            "torch.nn.utils.clip_grads_with_norm_ with a total norm that get_total_norm measured "
            "over this rank's local shards of FSDP2's DTensor gradients (to_local()): each rank "
            "clips by its own shard's norm"
        )
        assert "get_total_norm([p.grad for p in model.parameters()]) all-reduces" in message
        assert rel_err(rank["params"], want) > 1e-3  # the harm: not the clipped update
    first_steps = [rank["norms"][0] for rank in results]  # same gradients, different norms
    assert first_steps[0] != pytest.approx(first_steps[1], rel=1e-3)
    assert all(norm < global_norms[0] for norm in first_steps)


def test_one_process_reports_nothing(one_rank_group, guard_on):
    """One rank's shard is the whole tensor: its norm is the global one."""
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # the tracker watches its DTensors
    x, y = make_data(B)
    torch.nn.functional.mse_loss(model(x), y).backward()
    norm = torch.nn.utils.get_total_norm([p.grad.to_local() for p in model.parameters()])
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), 0.05, norm)
    opt.step()
    assert guard_on.findings() == []
