"""The engine's Accelerate-shaped API: prepare, the sync pattern, gating, single-process metrics."""

from __future__ import annotations

import pytest
import torch
from engine_reference import DEVICES, loss_fn, make_data, make_loader, make_model, make_optimizer

import guard
from guard.prepared import PreparedDataLoader, PreparedOptimizer, PreparedScheduler


def test_prepare_returns_objects_in_the_given_order():
    engine = guard.Engine("no", gradient_accumulation_steps=2)
    model = make_model()
    opt = make_optimizer("sgd", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    loader = make_loader(*make_data(8), batch_size=2)
    p_sched, p_loader, p_model, p_opt = engine.prepare(sched, loader, model, opt)
    assert isinstance(p_sched, PreparedScheduler) and p_sched.scheduler is sched
    assert isinstance(p_loader, PreparedDataLoader) and len(p_loader) == 4
    assert p_model is model
    assert isinstance(p_opt, PreparedOptimizer) and p_opt.optimizer is opt
    assert p_sched.optimizers == [p_opt]
    assert p_opt.param_groups is opt.param_groups
    assert engine.prepare(model) is model


def test_sync_pattern_counts_entries_and_forces_the_last_batch():
    """N=3 over 7 batches: syncs on 3, 6 and (forced) 7; the next epoch starts a fresh window."""
    engine = guard.Engine("no", gradient_accumulation_steps=3)
    model = make_model()
    loader = engine.prepare(make_loader(*make_data(14), batch_size=2))
    pattern = []
    for _ in range(2):
        for _batch in loader:
            with engine.accumulate(model):
                pattern.append(engine.sync_gradients)
    assert pattern == [False, False, True, False, False, True, True] * 2


def test_a_nested_evaluation_loader_does_not_touch_the_training_window():
    engine = guard.Engine("no", gradient_accumulation_steps=2)
    model = make_model()
    train = engine.prepare(make_loader(*make_data(8), batch_size=2))
    evaluation = engine.prepare(make_loader(*make_data(4), batch_size=2))
    pattern = []
    for _batch in train:
        with engine.accumulate(model):
            pattern.append(engine.sync_gradients)
        for _ in evaluation:
            pass
    assert pattern == [False, True, False, True]


@pytest.mark.parametrize("device", DEVICES)
def test_optimizer_step_and_zero_grad_do_nothing_on_non_sync_steps(device):
    engine = guard.Engine("no", gradient_accumulation_steps=2, device=device)
    model = make_model()
    model, opt = engine.prepare(model, make_optimizer("sgd", model.parameters()))
    x, y = make_data(4)
    before = [p.detach().clone() for p in model.parameters()]
    with engine.accumulate(model):
        engine.backward(loss_fn(model, x.to(device), y.to(device)))
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


def test_backward_leaves_the_callers_loss_alone():
    engine = guard.Engine("fp16", gradient_accumulation_steps=4)
    model = engine.prepare(make_model())
    x, y = make_data(4)
    loss = loss_fn(model, x, y)
    value, grad_fn = loss.detach().clone(), loss.grad_fn
    with engine.accumulate(model):
        engine.backward(loss)
    assert torch.equal(loss.detach(), value) and loss.grad_fn is grad_fn


def test_single_process_identity():
    engine = guard.Engine("no")
    assert (engine.num_processes, engine.process_index, engine.is_main_process) == (1, 0, True)
    values = torch.arange(5.0)
    assert torch.equal(engine.gather(values), values)
    assert torch.equal(engine.gather_for_metrics({"v": values})["v"], values)
    assert engine.gather(torch.tensor(3.0)).shape == (1,)


def test_engine_print_is_print_on_the_main_process(capsys):
    guard.Engine("no").print("hello", 3)
    assert capsys.readouterr().out == "hello 3\n"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mixed_precision": "fp8"}, "mixed_precision"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"tail": "drop"}, "tail"),
    ],
)
def test_bad_configuration_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        guard.Engine(**kwargs)


def test_preparing_a_model_twice_wraps_its_forward_once():
    engine = guard.Engine("bf16")
    model = make_model()
    engine.prepare(model)
    forward = model.forward
    assert engine.prepare(model) is model and model.forward is forward


def test_import_guard_does_not_load_the_engine():
    """`guard.Engine` is resolved lazily: `import guard` stays cheap."""
    import subprocess
    import sys

    code = "import sys, guard; assert 'guard.engine' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
