"""Checkpoints: resuming mid-window gives the parameters of an uninterrupted run."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from engine_reference import (
    DEVICES,
    flat_params,
    loss_fn,
    make_data,
    make_loader,
    make_model,
    make_optimizer,
)

import guard

N, B, STOP = 4, 4, 6  # stop after 6 of 12 batches: two micro-steps into the second window


def _setup(device, x, y):
    engine = guard.Engine("fp16", gradient_accumulation_steps=N, device=device)
    model = make_model()
    opt = make_optimizer("adamw", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    return engine, *engine.prepare(model, opt, make_loader(x, y, B), sched)


def _train(engine, model, opt, loader, sched, stop=None):
    for i, (xb, yb) in enumerate(loader):
        with engine.accumulate(model):
            engine.backward(loss_fn(model, xb, yb))
            if engine.sync_gradients:
                engine.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
            sched.step()
            opt.zero_grad()
        if stop is not None and i + 1 == stop:
            break


def _roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _resumed(device, x, y, restore_engine: bool, skip_in_loader: bool = False):
    engine, model, opt, loader, sched = _setup(device, x, y)
    _train(engine, model, opt, loader, sched, stop=STOP)
    saved = _roundtrip(
        {
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "sched": sched.state_dict(),
            "engine": engine.state_dict(),
        }
    )
    engine, model, opt, loader, sched = _setup(device, x, y)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    if restore_engine:
        engine.load_state_dict(saved["engine"])
    if skip_in_loader:
        rest = engine.skip_first_batches(loader, STOP)
    else:
        rest = engine.prepare(make_loader(x[STOP * B :], y[STOP * B :], B))
    _train(engine, model, opt, rest, sched)
    return flat_params(model), engine


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("skip_in_loader", [False, True], ids=["remaining-data", "skip-batches"])
def test_resume_mid_window_equals_uninterrupted_run(device, skip_in_loader):
    """Resume on a loader over the remaining samples, or on the full one with skipped batches."""
    x, y = make_data(12 * B)
    engine, model, opt, loader, sched = _setup(device, x, y)
    _train(engine, model, opt, loader, sched)
    resumed, resumed_engine = _resumed(device, x, y, True, skip_in_loader)
    assert torch.equal(resumed, flat_params(model))
    assert resumed_engine.scaler.get_scale() == engine.scaler.get_scale()
    assert resumed_engine.optimizer_steps == engine.optimizer_steps == 3


@pytest.mark.parametrize("device", DEVICES)
def test_resume_without_engine_state_loses_the_half_window(device):
    """The contrast: model and optimizer state alone do not reproduce the run."""
    x, y = make_data(12 * B)
    engine, model, opt, loader, sched = _setup(device, x, y)
    _train(engine, model, opt, loader, sched)
    resumed, _ = _resumed(device, x, y, restore_engine=False)
    assert not torch.allclose(resumed, flat_params(model), rtol=0, atol=1e-6)


def test_state_dict_is_a_snapshot():
    x, y = make_data(12 * B)
    engine, model, opt, loader, sched = _setup("cpu", x, y)
    _train(engine, model, opt, loader, sched, stop=STOP)
    state = engine.state_dict()
    frozen = copy.deepcopy(state)
    with engine.accumulate(model):
        engine.backward(loss_fn(model, x[:B], y[:B]))
    assert state["window"] == frozen["window"]
    assert all(torch.equal(a, b) for a, b in zip(state["grads"], frozen["grads"], strict=True))
