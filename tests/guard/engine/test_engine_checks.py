"""The engine's own runtime checks: each code fires with numbers in its message, before damage,
and stays silent on the correct variant."""

from __future__ import annotations

import warnings

import pytest
import torch
from engine_reference import flat_params, loss_fn, make_data, make_loader, make_model

import guard
from guard import _report

N, B = 4, 4


@pytest.fixture(params=["installed", "engine-only"])
def checks(request):
    """Raise mode, no findings; with the guard's general checks installed, and without them."""
    was_installed = guard.installed()
    if request.param == "installed":
        guard.install()
    else:
        guard.uninstall()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="raise")
    guard.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        yield request.param
    guard.reset()
    _report._state.settings = saved
    if was_installed:
        guard.install()
    else:
        guard.uninstall()


def codes() -> list[str]:
    return sorted(f.code for f in guard.findings())


def _prepared(precision="no", n=N, **kwargs):
    engine = guard.Engine(precision, gradient_accumulation_steps=n, **kwargs)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = engine.prepare(model, opt)
    return engine, model, opt


def _batch():
    x, y = make_data(B)
    return x, y


def test_acl105_scaler_refused_in_bf16(checks):
    with pytest.raises(guard.GuardError, match="ACL105"):
        guard.Engine("bf16").prepare(torch.amp.GradScaler("cpu"))


def test_acl105_fp16_adopts_the_callers_scaler(checks):
    engine = guard.Engine("fp16")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    assert engine.prepare(scaler) is scaler and engine.scaler is scaler
    assert codes() == []


def test_acl107_fp16_parameters_under_a_scaler(checks):
    with pytest.raises(guard.GuardError, match="ACL107.*fp16 parameters"):
        guard.Engine("fp16").prepare(make_model().half())


def test_acl107_bf16_parameters_with_accumulation_warn(checks):
    guard.Engine("bf16", gradient_accumulation_steps=N).prepare(make_model().bfloat16())
    assert codes() == ["ACL107"]
    assert "4-step accumulation" in guard.findings()[0].message


def test_acl107_silent_for_fp32_weights_and_frozen_half_models(checks):
    engine = guard.Engine("fp16", gradient_accumulation_steps=N)
    frozen = make_model().half().requires_grad_(False)
    engine.prepare(make_model(), frozen)
    assert codes() == []


def test_acl202_backward_under_autocast_is_refused_before_it_runs(checks):
    engine, model, _ = _prepared("bf16")
    x, y = _batch()
    with engine.accumulate(model), engine.autocast():
        loss = loss_fn(model, x, y)
        with pytest.raises(guard.GuardError, match="ACL202"):
            engine.backward(loss)
    assert all(p.grad is None for p in model.parameters())


def test_acl302_loss_already_divided_by_n(checks):
    engine, model, _ = _prepared()
    x, y = _batch()
    with engine.accumulate(model):
        engine.backward(loss_fn(model, x, y) / N)
    assert codes() == ["ACL302"]
    assert "1/4" in guard.findings()[0].message


def test_acl302_silent_for_other_divisors(checks):
    engine, model, _ = _prepared()
    x, y = _batch()
    with engine.accumulate(model):
        engine.backward(loss_fn(model, x, y) / 3)
    with engine.accumulate(model):
        engine.backward(loss_fn(model, x, y) * 2)
    assert codes() == []


def test_acl303_clip_on_a_non_sync_micro_step(checks):
    engine, model, _ = _prepared("fp16")
    x, y = _batch()
    with engine.accumulate(model):
        engine.backward(loss_fn(model, x, y))
        grads = [p.grad.clone() for p in model.parameters()]
        with pytest.raises(guard.GuardError, match=r"ACL303.*1 of 4"):
            engine.clip_grad_norm_(model.parameters(), 1.0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


def test_acl303_silent_when_gated_on_sync(checks):
    engine, model, opt = _prepared("fp16")
    x, y = _batch()
    for _ in range(N):
        with engine.accumulate(model):
            engine.backward(loss_fn(model, x, y))
            if engine.sync_gradients:
                engine.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    assert codes() == []


def test_acl306_backward_outside_accumulate(checks):
    engine, model, _ = _prepared()
    x, y = _batch()
    with pytest.raises(guard.GuardError, match=r"ACL306.*gradient_accumulation_steps=4"):
        engine.backward(loss_fn(model, x, y))


def test_acl306_silent_without_accumulation(checks):
    engine, model, opt = _prepared(n=1)
    x, y = _batch()
    engine.backward(loss_fn(model, x, y))
    opt.step()
    assert codes() == []


@pytest.mark.parametrize("tail, noted", [("accelerate", True), ("exact", False)])
def test_acl307_tail_weight_note(checks, capsys, tail, noted):
    """A note on stderr, once, and no finding: the default tail weight is documented behaviour."""
    engine = guard.Engine("no", gradient_accumulation_steps=N, tail=tail)
    model = make_model()
    model, opt, loader = engine.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.1), make_loader(*make_data(6 * B), B)
    )
    for xb, yb in loader:
        with engine.accumulate(model):
            engine.backward(loss_fn(model, xb, yb))
            opt.step()
            opt.zero_grad()
    assert codes() == []
    notes = [line for line in capsys.readouterr().err.splitlines() if "accel-guard note" in line]
    assert notes == (
        [
            "accel-guard note: ACL307: the loader ended after 2 of 4 micro-batches of a window; "
            "the engine stepped on them, each divided by 4 as Accelerate does, so this tail counts "
            "2/4 of a full window; Engine(tail='exact') gives it the weight of a full batch "
            "(accel-lint --explain ACL307)"
        ]
        if noted
        else []
    )


def test_acl601_nan_loss_is_refused_before_the_step(checks):
    engine, model, opt = _prepared()
    x, y = _batch()
    start = flat_params(model)
    with pytest.raises(guard.GuardError, match="ACL601"):
        for i in range(N):
            with engine.accumulate(model):
                loss = loss_fn(model, x, y)
                engine.backward(loss * float("nan") if i == 1 else loss)
                opt.step()
    assert torch.equal(flat_params(model), start)


def test_acl601_half_precision_inf_loss_among_fp32_losses(checks):
    """The window's losses are read together: a bf16 inf next to fp32 losses is still seen."""
    engine, model, opt = _prepared()
    x, y = _batch()
    start = flat_params(model)
    with pytest.raises(guard.GuardError, match="ACL601"):
        for i in range(N):
            with engine.accumulate(model):
                loss = loss_fn(model, x, y)
                engine.backward(loss.bfloat16() * float("inf") if i == 2 else loss)
                opt.step()
    assert torch.equal(flat_params(model), start)


def test_acl601_silent_for_finite_losses(checks):
    engine, model, opt = _prepared()
    x, y = _batch()
    for _ in range(N):
        with engine.accumulate(model):
            engine.backward(loss_fn(model, x, y))
            engine.clip_grad_norm_(model.parameters(), 1.0) if engine.sync_gradients else None
            opt.step()
            opt.zero_grad()
    assert codes() == []


def test_acl603_overflow_streak(checks):
    guard.configure(overflow_streak=3)
    engine, model, opt = _prepared("fp16", n=1)
    x, y = _batch()
    hook = model[0].weight.register_hook(lambda g: g * float("inf"))
    with pytest.raises(guard.GuardError, match=r"ACL603.*3 optimizer steps in a row"):
        for _ in range(5):
            with engine.accumulate(model):
                engine.backward(loss_fn(model, x, y))
                opt.step()
                opt.zero_grad()
    hook.remove()
    assert engine.scaler.get_scale() == 65536.0 / 8


def test_acl603_silent_for_isolated_overflows(checks):
    guard.configure(overflow_streak=3)
    engine, model, opt = _prepared("fp16", n=1)
    x, y = _batch()
    for i in range(6):
        hook = i % 2 == 0 and model[0].weight.register_hook(lambda g: g * float("inf"))
        with engine.accumulate(model):
            engine.backward(loss_fn(model, x, y))
            opt.step()
            opt.zero_grad()
        if hook:
            hook.remove()
    assert codes() == []


def _token_window(engine, model, batches, use_items=False):
    from engine_reference import token_loss

    for tokens, labels in batches:
        with engine.accumulate(model):
            if use_items:
                loss = token_loss(model, tokens, labels, "sum")
                engine.backward(loss, num_items=(labels != -100).sum())
            else:
                engine.backward(token_loss(model, tokens, labels, "mean"))


@pytest.mark.parametrize("use_items, expected", [(False, ["ACL308"]), (True, [])])
def test_acl308_token_means_with_uneven_counts(checks, use_items, expected):
    from engine_reference import make_token_batches, make_token_model

    engine = guard.Engine("no", gradient_accumulation_steps=N)
    model = make_token_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    _token_window(engine, model, make_token_batches(N), use_items)
    opt.step()
    assert codes() == expected


def test_acl308_silent_for_equal_counts(checks):
    from engine_reference import make_token_model

    engine = guard.Engine("no", gradient_accumulation_steps=N)
    model = make_token_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tokens = torch.randint(0, 11, (2, 5))
    _token_window(engine, model, [(tokens, tokens)] * N)
    opt.step()
    assert codes() == []
