"""The engine under the installed guard: a correct engine loop is silent, and the general checks
recognise the engine's prepared objects (the original optimizer stepped, a raw backward)."""

from __future__ import annotations

import pytest
import torch
from engine_reference import engine_run, flat_params, loss_fn, make_data, make_model

import guard

N, B = 4, 4


def _codes(guard_module) -> list[str]:
    return sorted(f.code for f in guard_module.findings())


@pytest.mark.parametrize("precision", ["no", "fp16", "bf16"])
@pytest.mark.parametrize("opt_kind", ["sgd", "adamw"])
def test_a_correct_engine_loop_has_no_findings(guard_on, precision, opt_kind):
    x, y = make_data(18 * B)  # a tail window, flushed with tail="exact" (no ACL307 note)
    engine = guard.Engine(precision, gradient_accumulation_steps=N, tail="exact")
    engine_run(engine, x, y, B, opt_kind, clip=0.05, epochs=2)
    assert _codes(guard_on) == []


def test_acl108_original_optimizer_after_engine_prepare(guard_on):
    engine = guard.Engine("no", gradient_accumulation_steps=N)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, _prepared_opt = engine.prepare(model, opt)
    x, y = make_data(B)
    with engine.accumulate(model):
        engine.backward(loss_fn(model, x, y))
    start = flat_params(model)
    with pytest.raises(guard.GuardError, match="ACL108"):
        opt.step()
    assert torch.equal(flat_params(model), start)


def test_acl108_original_scheduler_after_engine_prepare(guard_on):
    engine = guard.Engine("no", gradient_accumulation_steps=N)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    engine.prepare(model, opt, sched)
    with pytest.raises(guard.GuardError, match="ACL108"):
        sched.step()


def test_acl101_raw_backward_on_an_engine_model(guard_on):
    engine = guard.Engine("no", gradient_accumulation_steps=N)
    model = make_model()
    model, _opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = make_data(B)
    with engine.accumulate(model), pytest.raises(guard.GuardError, match="ACL101.*1/4"):
        loss_fn(model, x, y).backward()
