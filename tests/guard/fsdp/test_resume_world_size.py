"""engine.save_sharded_state / load_sharded_state across world sizes, at an epoch boundary: 2
ranks (sharded) to 1 process (unsharded) and back. torch.distributed.checkpoint reshards the
model and optimizer state on load, so the loaded state equals the saved one bit for bit, and
the continued run equals a single-process reference (the scheduler keeps the engine's pace: W
steps per optimizer step, W being the world size of each epoch). A checkpoint saved in the
middle of an epoch is refused on another world size, before anything is loaded."""

from __future__ import annotations

import fsdp_resume_cases
import pytest
import torch
import torch.nn.functional as F
from fsdp_reference import flat_params, make_data, make_model, make_optimizer, rel_err

W, N, B, STEPS = 2, 2, 2, 2
SAMPLES = STEPS * W * N * B  # one epoch: STEPS optimizer steps of W * N * B samples
RUN = fsdp_resume_cases.epoch_then_checkpoint


def reference(repeats_per_epoch: list[int]) -> torch.Tensor:
    """One process, one global batch per optimizer step, torch's clip; the scheduler stepped
    `repeats` times per optimizer step in each epoch (as the engine on that world size)."""
    model = make_model()
    opt = make_optimizer("adamw", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    x, y = make_data(SAMPLES)
    per_step = W * N * B
    for repeats in repeats_per_epoch:
        for s in range(STEPS):
            opt.zero_grad()
            F.mse_loss(
                model(x[s * per_step : (s + 1) * per_step]), y[s * per_step : (s + 1) * per_step]
            ).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), fsdp_resume_cases.CLIP)
            opt.step()
            for _ in range(repeats):
                sched.step()
    return flat_params(model)


def assert_resumed_exactly(loaded: dict, saved: dict) -> None:
    for key in ("params", "optimizer"):
        assert torch.equal(loaded[key], saved[key]), key
    for key in ("optimizer_steps", "scheduler_epoch", "lr"):
        assert loaded[key] == saved[key], key


def test_two_ranks_resume_on_one_process(fsdp_pool, guard_on, tmp_path):
    directory = str(tmp_path / "ckpt")
    saved = fsdp_pool.run(RUN, directory=directory, samples=SAMPLES, batch_size=B, n=N, load=False)
    assert [rank["sharded"] for rank in saved] == ["DTensor", "DTensor"]
    assert torch.equal(saved[0]["trained"]["optimizer"], saved[1]["trained"]["optimizer"])
    # the same global batch per optimizer step: one process takes W micro-batches' rows at once
    here = RUN(directory=directory, samples=SAMPLES, batch_size=W * B, n=N, load=True)
    assert (here["world"], here["sharded"]) == (1, "Parameter")
    assert_resumed_exactly(here["loaded"], saved[0]["trained"])
    assert here["trained"]["optimizer_steps"] == 2 * STEPS
    assert rel_err(here["trained"]["params"], reference([W, 1])) <= 1e-6
    assert here["findings"] == [] and all(rank["findings"] == [] for rank in saved)


def test_one_process_resumes_on_two_ranks(fsdp_pool, guard_on, tmp_path):
    directory = str(tmp_path / "ckpt")
    saved = RUN(directory=directory, samples=SAMPLES, batch_size=W * B, n=N, load=False)
    assert saved["sharded"] == "Parameter"
    resumed = fsdp_pool.run(RUN, directory=directory, samples=SAMPLES, batch_size=B, n=N, load=True)
    want = reference([1, W])
    for rank in resumed:
        assert rank["sharded"] == "DTensor"
        assert_resumed_exactly(rank["loaded"], saved["trained"])
        assert rank["trained"]["optimizer_steps"] == 2 * STEPS
        assert rel_err(rank["trained"]["params"], want) <= 1e-6
        assert rank["findings"] == []
    assert torch.equal(resumed[0]["trained"]["params"], resumed[1]["trained"]["params"])


def refusal(saved_by: str, loaded_by: str) -> str:
    return (
        f"this FSDP2 checkpoint was saved by {saved_by} in the middle of an epoch; loading it "
        f"on {loaded_by} would continue the epoch with other batches on each rank"
    )


def test_a_mid_epoch_checkpoint_is_refused_on_another_world_size(fsdp_pool, guard_on, tmp_path):
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    fsdp_pool.run(RUN, directory=two, samples=SAMPLES, batch_size=B, n=N, load=False, stop_after=1)
    with pytest.raises(RuntimeError, match=refusal("2 processes", "1 process")) as raised:
        RUN(directory=two, samples=SAMPLES, batch_size=W * B, n=N, load=True)
    assert "resume it on 2 processes, or save at an epoch boundary" in str(raised.value)
    RUN(directory=one, samples=SAMPLES, batch_size=W * B, n=N, load=False, stop_after=1)
    with pytest.raises(
        AssertionError, match=refusal("1 process", "2 processes")
    ):  # the pool's error, from both ranks
        fsdp_pool.run(RUN, directory=one, samples=SAMPLES, batch_size=B, n=N, load=True)
