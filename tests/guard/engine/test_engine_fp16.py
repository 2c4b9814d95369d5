"""fp16: real autocast and a real GradScaler on every device (CPU included), and skipped steps."""

from __future__ import annotations

import pytest
import torch
from engine_reference import (
    DEVICES,
    engine_run,
    flat_params,
    loss_fn,
    make_data,
    make_loader,
    make_model,
    make_optimizer,
    rel_err,
)

import guard

N, B = 4, 4


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_forward_runs_in_float16_and_returns_float32(device):
    engine = guard.Engine("fp16", gradient_accumulation_steps=N, device=device)
    model = engine.prepare(make_model())
    inner_dtypes = []
    model[0].register_forward_hook(lambda mod, args, out: inner_dtypes.append(out.dtype))
    out = model(torch.randn(2, 6, device=device))
    assert inner_dtypes == [torch.float16]
    assert out.dtype == torch.float32
    assert isinstance(engine.scaler, torch.amp.GradScaler)
    assert engine.scaler.is_enabled() and engine.scaler._device == device


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_no_scaler_outside_fp16(precision):
    assert guard.Engine(precision, gradient_accumulation_steps=N).scaler is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_kind", ["sgd", "adamw"])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_fp16_equals_a_manual_amp_accumulation_loop(device, opt_kind, clip):
    x, y = make_data(18 * B)  # windows 4,4,4,4,2: the tail is flushed with 1/N
    engine = guard.Engine("fp16", gradient_accumulation_steps=N, device=device)
    got, _ = engine_run(engine, x, y, B, opt_kind, clip)
    # fp32 would already differ by ~4e-6 here: the bound tells fp16 apart from fp32
    assert rel_err(got, _manual_amp(x, y, device, opt_kind, clip)) <= 1e-7


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_exact_tail_rescales_before_unscaling(device):
    """tail="exact" multiplies the scaled tail gradients by N/r before unscale and clip.

    No clipping here: a clip that binds would hide the tail's scale.
    """
    x, y = make_data(18 * B)  # windows 4,4,4,4,2
    engine = guard.Engine("fp16", gradient_accumulation_steps=N, device=device, tail="exact")
    got, _ = engine_run(engine, x, y, B, "sgd", clip=None)
    assert rel_err(got, _manual_amp(x, y, device, "sgd", None, tail_divisor=2)) <= 1e-7
    assert rel_err(got, _manual_amp(x, y, device, "sgd", None, tail_divisor=N)) > 1e-4


def _manual_amp(x, y, device, opt_kind, clip, tail_divisor=N):
    """The textbook AMP accumulation loop: autocast forward, scaled loss / N, unscale, clip.

    A tail window shorter than N is divided by `tail_divisor` instead.
    """
    model = make_model().to(device)
    opt = make_optimizer(opt_kind, model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    scaler = torch.amp.GradScaler(device)
    batches = list(zip(x.split(B), y.split(B), strict=True))
    for start in range(0, len(batches), N):
        window = batches[start : start + N]
        divisor = N if len(window) == N else tail_divisor
        for xb, yb in window:
            with torch.autocast(device, dtype=torch.float16):
                out = model(xb.to(device))
            loss = torch.nn.functional.mse_loss(out.float(), yb.to(device))
            scaler.scale(loss / divisor).backward()
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() >= before:
            sched.step()
        opt.zero_grad()
    return flat_params(model)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "adamw-fused"])
def test_overflow_skips_step_backs_off_and_holds_the_scheduler(device, fused):
    """An inf gradient in window 2: no update, scale halved, scheduler and step count unchanged.

    The fused AdamW skips inside its kernel, where torch's own skip flag stays unset; the engine
    sees the skip through the scale back-off.
    """
    x, y = make_data(12 * B)  # three windows
    engine = guard.Engine("fp16", gradient_accumulation_steps=N, device=device)
    model = make_model()
    opt = make_optimizer("adamw", model.parameters(), fused=fused)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, loader, sched = engine.prepare(model, opt, make_loader(x, y, B), sched)
    windows = []  # per window: params, scale and lr on entry; params, scale, skip flag on exit
    for i, (xb, yb) in enumerate(loader):
        with engine.accumulate(model):
            if engine.sync_gradients:
                windows.append([flat_params(model), engine.scaler.get_scale(), sched.get_last_lr()])
            poison = i == 5 and model[0].weight.register_hook(lambda g: g * float("inf"))
            engine.backward(loss_fn(model, xb, yb))
            if poison:
                poison.remove()
            opt.step()
            sched.step()
            opt.zero_grad()
            if engine.sync_gradients:
                windows[-1] += [flat_params(model), engine.scaler.get_scale(), opt.step_was_skipped]
    first, poisoned, last = windows
    assert [w[5] for w in windows] == [False, True, False]
    assert not torch.equal(first[0], first[3]) and not torch.equal(last[0], last[3])
    assert torch.equal(poisoned[0], poisoned[3])  # the poisoned window changed nothing
    assert poisoned[4] == poisoned[1] / 2  # the scale backed off
    lr0 = first[2][0]
    assert poisoned[2] == last[2] == [lr0 / 2]  # one scheduler step so far, none for the skip
    assert sched.get_last_lr() == [lr0 / 4]
    assert engine.optimizer_steps == 2
    assert opt.optimizer.state[next(iter(model.parameters()))]["step"].item() == 2
