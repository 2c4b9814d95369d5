"""fp32 and bf16: the engine equals a large-batch loop and Accelerate (the oracle) step for step."""

from __future__ import annotations

import pytest
import torch
from engine_reference import (
    DEVICES,
    engine_run,
    flat_params,
    large_batch_run,
    make_data,
    make_model,
    rel_err,
    windows_for,
)

import guard

N, B = 4, 4


def _accelerator(device: str, precision: str):
    from accelerate import Accelerator

    cpu = device == "cpu"
    return Accelerator(cpu=cpu, mixed_precision=precision, gradient_accumulation_steps=N)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_kind", ["sgd", "adamw"])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_fp32_micro_batches_equal_one_large_batch(device, opt_kind, clip):
    x, y = make_data(16 * B)
    engine = guard.Engine("no", gradient_accumulation_steps=N, device=device)
    got, _ = engine_run(engine, x, y, B, opt_kind, clip)
    want = large_batch_run(x, y, windows_for(16, N), B, opt_kind, clip, device)
    assert rel_err(got, want) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_kind", ["sgd", "adamw"])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_bf16_micro_batches_track_one_large_batch(device, opt_kind, clip):
    """bf16 rounds each micro-batch's matmuls: the parameter *updates* agree to bf16 resolution.

    Comparing updates (not parameters) keeps the check sharp: a wrong 1/N is a 300% error.
    """
    x, y = make_data(16 * B)
    engine = guard.Engine("bf16", gradient_accumulation_steps=N, device=device)
    got, _ = engine_run(engine, x, y, B, opt_kind, clip)
    want = large_batch_run(x, y, windows_for(16, N), B, opt_kind, clip, device)
    start = flat_params(make_model())
    assert rel_err(got - start, want - start) <= 2e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["no", "bf16"])
@pytest.mark.parametrize("opt_kind", ["sgd", "adamw"])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_matches_accelerate_with_tail_over_two_epochs(device, precision, opt_kind, clip):
    """18 batches with N=4: windows 4,4,4,4,2 per epoch; Accelerate flushes the tail with 1/N."""
    x, y = make_data(18 * B)
    engine = guard.Engine(precision, gradient_accumulation_steps=N, device=device)
    got, got_sched = engine_run(engine, x, y, B, opt_kind, clip, epochs=2)
    oracle = _accelerator(device, precision)
    want, want_sched = engine_run(oracle, x, y, B, opt_kind, clip, epochs=2)
    assert rel_err(got, want) <= 1e-6
    assert got_sched.scheduler.last_epoch == want_sched.scheduler.last_epoch == 10


@pytest.mark.parametrize("device", DEVICES)
def test_tail_weight_accelerate_is_r_over_n(device):
    """Default tail: the r tail micro-batches are each divided by N (weight r/N), as Accelerate."""
    x, y = make_data(6 * B)  # windows 4, 2
    engine = guard.Engine("no", gradient_accumulation_steps=N, device=device)
    got, sched = engine_run(engine, x, y, B, "sgd", None)
    assert rel_err(got, _manual_accumulation(x, y, device, tail_divisor=N)) <= 1e-6
    assert rel_err(got, _manual_accumulation(x, y, device, tail_divisor=2)) > 1e-4
    assert sched.scheduler.last_epoch == 2  # the tail forced a second, real step


@pytest.mark.parametrize("device", DEVICES)
def test_tail_exact_is_the_mean_over_the_tail(device):
    """tail="exact": the tail window is the plain mean of its r micro-batches."""
    x, y = make_data(6 * B)
    engine = guard.Engine("no", gradient_accumulation_steps=N, device=device, tail="exact")
    got, _ = engine_run(engine, x, y, B, "sgd", None)
    assert rel_err(got, large_batch_run(x, y, [4, 2], B, "sgd", None, device)) <= 1e-6
    assert rel_err(got, _manual_accumulation(x, y, device, tail_divisor=2)) <= 1e-6
    assert rel_err(got, _manual_accumulation(x, y, device, tail_divisor=N)) > 1e-4


def _manual_accumulation(x, y, device, tail_divisor, clip=None):
    """A hand-written accumulation loop: windows divided by N, the tail by `tail_divisor`."""
    from engine_reference import flat_params, loss_fn, make_model, make_optimizer

    model = make_model().to(device)
    opt = make_optimizer("sgd", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    batches = list(zip(x.split(B), y.split(B), strict=True))
    for start in range(0, len(batches), N):
        window = batches[start : start + N]
        divisor = N if len(window) == N else tail_divisor
        for xb, yb in window:
            (loss_fn(model, xb.to(device), yb.to(device)) / divisor).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad()
    return flat_params(model)
