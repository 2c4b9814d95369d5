"""ACL302, 303, 304, 306, 308, 309, 310 in HF Accelerate loops (CPU, one process): the loop
patterns of Accelerate's examples under the guard in raise mode, errors before the damage, and
the must-not-flag variants."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import codes, grads_of, make_loader, make_model, mse, params_of, same  # noqa: E402

N = 4


def prepared(n: int = N, plugin=None, scheduler=None, batches: int = 8, **kwargs):
    from accelerate import Accelerator

    if plugin is not None:
        accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin, **kwargs)
    else:
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=n, **kwargs)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    objects = [model, opt, make_loader(batches)] + ([scheduler(opt)] if scheduler else [])
    return accelerator, *accelerator.prepare(*objects)


def train(accelerator, model, opt, loader, sched=None, epochs: int = 1, clip: bool = False):
    """The loop of Accelerate's gradient-accumulation example."""
    for _ in range(epochs):
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(mse(model, batch))
                if clip and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                if sched is not None:
                    sched.step()
                opt.zero_grad()


def test_the_example_loop_is_clean_with_every_check_on(guard_on):
    accelerator, model, opt, loader, sched = prepared(
        scheduler=lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.05, total_steps=4)
    )
    train(accelerator, model, opt, loader, sched, epochs=2, clip=True)
    from guard import _tracker

    _tracker.TRACKER.emit("finish")
    assert codes(guard_on) == []


# -- ACL302 ---------------------------------------------------------------------------------------


def test_acl302_manual_division_warns(guard_on):
    accelerator, model, opt, loader = prepared()
    batches = iter(loader)
    batch = next(batches)
    with accelerator.accumulate(model):
        accelerator.backward(mse(model, batch) / N)
    [finding] = guard_on.findings()
    assert finding.code == "ACL302" and finding.level == "warning"
    assert "each micro-batch weighs 1/16 instead of 1/4" in finding.message


def test_acl302_must_not_flag_single_division_or_token_normalisation(guard_on):
    accelerator, model, opt, loader = prepared(n=1)  # the manual division is the only one
    for i, batch in enumerate(loader):
        accelerator.backward(mse(model, batch) / N)
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator, model, opt, loader = prepared()
    for batch in loader:  # the global normalisation multiplies N back
        with accelerator.accumulate(model):
            n_items = torch.tensor(37.0)
            accelerator.backward(mse(model, batch) * len(batch[0]) * N / n_items)
            opt.step()
            opt.zero_grad()
    assert codes(guard_on) == []


# -- ACL303 ---------------------------------------------------------------------------------------


def test_acl303_clip_on_a_non_sync_micro_step_raises_before_clipping(guard_on):
    accelerator, model, opt, loader = prepared()
    batches = iter(loader)
    batch = next(batches)
    with accelerator.accumulate(model):
        accelerator.backward(mse(model, batch))
        grads = grads_of(model)
        with pytest.raises(guard_on.GuardError) as info:
            accelerator.clip_grad_norm_(model.parameters(), 1e-3)
    assert info.value.code == "ACL303"
    assert "non-sync micro-step (1 of 4 micro-batches" in str(info.value)
    assert same(grads, grads_of(model))


# -- ACL304 ---------------------------------------------------------------------------------------


def test_acl304_zero_grad_at_the_top_of_the_block_raises_before_wiping(guard_on):
    accelerator, model, opt, loader = prepared()
    batches = iter(loader)
    for _ in range(N - 1):
        batch = next(batches)
        with accelerator.accumulate(model):
            opt.zero_grad()  # a no-op on non-sync micro-steps
            accelerator.backward(mse(model, batch))
            opt.step()
    grads = grads_of(model)
    next(batches)
    with accelerator.accumulate(model):
        with pytest.raises(guard_on.GuardError) as info:
            opt.zero_grad()  # the sync step: this one really zeroes
    assert info.value.code == "ACL304"
    assert "3 micro-batch(es) of a 4-micro-batch window" in str(info.value)
    assert same(grads, grads_of(model))


def test_acl304_window_ending_on_the_loaders_last_batch_is_still_caught(guard_on):
    """The prepared loader reads one batch ahead, so its pass "ends" before the last batch runs;
    a top-of-block zero_grad on that last batch (the sync step) still wipes the window (found by
    the generated-loop properties, tests/generated/)."""
    accelerator, model, opt, loader = prepared(batches=N)
    with pytest.raises(guard_on.GuardError) as info:
        for batch in loader:
            with accelerator.accumulate(model):
                opt.zero_grad()
                accelerator.backward(mse(model, batch))
                opt.step()
    assert info.value.code == "ACL304"
    assert "3 micro-batch(es) of a 4-micro-batch window" in str(info.value)


# -- ACL306 ---------------------------------------------------------------------------------------


def test_acl306_missing_accumulate_raises_before_the_first_step(guard_on):
    accelerator, model, opt, loader = prepared()
    batches = iter(loader)
    accelerator.backward(mse(model, next(batches)))
    before = params_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        opt.step()
    assert info.value.code == "ACL306"
    assert "uses 1 backward pass(es) made outside accelerator.accumulate()" in str(info.value)
    assert same(before, params_of(model))


def test_acl306_must_not_flag_a_loop_that_gates_on_n_itself(guard_on):
    """As in Accelerate's autoregressive example: windows of N fetched by hand, a shorter tail."""
    accelerator, model, opt, loader = prepared(batches=10)
    batches = iter(loader)
    for window in (N, N, 10 - 2 * N):
        for batch in [next(batches) for _ in range(window)]:
            accelerator.backward(mse(model, batch) * N / window)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    assert codes(guard_on) == []


# -- ACL308 ---------------------------------------------------------------------------------------


def _token_batches(lengths: list[int]):
    torch.manual_seed(0)
    batches = []
    for length in lengths:
        ids = torch.randint(1, 16, (2, 8))
        labels = ids.clone()
        labels[:, length:] = -100
        batches.append((ids, labels))
    return batches


def _token_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_acl308_token_means_over_a_window_of_unequal_lengths(guard_on, reduction):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=N)
    model = _token_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _token_batches([1, 2, 8, 8])
    loader = DataLoader(batches, batch_size=None)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    n_tokens = sum(int((labels != -100).sum()) for _, labels in batches)
    for ids, labels in loader:
        with accelerator.accumulate(model):
            logits = model(ids).flatten(0, 1)
            loss = nn.functional.cross_entropy(logits, labels.flatten(), reduction=reduction)
            if reduction == "sum":
                loss = loss * N / n_tokens
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
    if reduction == "sum":
        assert codes(guard_on) == []
        return
    [finding] = guard_on.findings()
    assert finding.code == "ACL308" and finding.level == "warning"
    assert "4 micro-batches with 2 to 16 valid tokens" in finding.message
    assert "weighs 8.0x" in finding.message


# -- ACL309 ---------------------------------------------------------------------------------------


def test_acl309_second_entry_for_one_batch_raises_at_the_entry(guard_on):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=N)
    encoder, head = nn.Linear(8, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.05)
    encoder, head, opt, loader = accelerator.prepare(encoder, head, opt, make_loader())
    batches = iter(loader)
    x, y = next(batches)
    with accelerator.accumulate(encoder):
        features = encoder(x)
    step_before = accelerator.step
    with pytest.raises(guard_on.GuardError) as info:
        with accelerator.accumulate(head):
            pass
    assert info.value.code == "ACL309" and "second accelerator.accumulate()" in str(info.value)
    assert accelerator.step == step_before  # the counter did not tick a second time
    assert features.requires_grad


def test_acl309_two_backward_passes_in_one_entry_raise_at_the_second(guard_on):
    accelerator, model, opt, loader = prepared()
    batches = iter(loader)
    batch = next(batches)
    with accelerator.accumulate(model):
        accelerator.backward(mse(model, batch))
        with pytest.raises(guard_on.GuardError) as info:
            accelerator.backward(mse(model, batch))
    assert info.value.code == "ACL309" and "2 backward passes" in str(info.value)


def test_acl309_unprepared_loader_raises_at_the_entry(guard_on):
    accelerator, model, opt, _loader = prepared()
    with pytest.raises(guard_on.GuardError) as info:
        for batch in make_loader():
            with accelerator.accumulate(model):
                accelerator.backward(mse(model, batch))
    assert info.value.code == "ACL309" and "no prepared dataloader" in str(info.value)


def test_acl309_must_not_flag_one_entry_for_two_models_or_own_windows(guard_on):
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=N)
    encoder, head = nn.Linear(8, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.05)
    encoder, head, opt, loader = accelerator.prepare(encoder, head, opt, make_loader())
    for x, y in loader:
        with accelerator.accumulate(encoder, head):
            accelerator.backward(nn.functional.mse_loss(head(encoder(x)), y))
            opt.step()
            opt.zero_grad()
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    plugin = GradientAccumulationPlugin(num_steps=N, sync_with_dataloader=False)
    accelerator, model, opt, loader = prepared(plugin=plugin)
    for batch in make_loader():  # a plain loader, windows managed by the loop
        with accelerator.accumulate(model):
            accelerator.backward(mse(model, batch))
            opt.step()
            opt.zero_grad()
    assert codes(guard_on) == []


# -- ACL310 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", ["micro_batches", "optimizer_steps"])
def test_acl310_schedule_length_is_judged_at_the_end_of_the_run(guard_on, length):
    from guard import _tracker

    epochs, batches = 2, 8
    total = batches * epochs if length == "micro_batches" else math.ceil(batches / N) * epochs
    accelerator, model, opt, loader, sched = prepared(
        scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: max(0, 1 - s / total))
    )
    train(accelerator, model, opt, loader, sched, epochs=epochs)
    _tracker.TRACKER.emit("finish")
    if length == "optimizer_steps":
        assert codes(guard_on) == []
        return
    [finding] = guard_on.findings()
    assert finding.code == "ACL310" and finding.level == "warning"
    assert "built for 16 steps but training ended at step 4 (25% of the schedule)" in (
        finding.message
    )
    assert "test_accelerate_loops.py" in finding.location  # where the scheduler was prepared


def test_acl310_a_run_that_crashed_is_not_judged(guard_on, monkeypatch):
    from guard import _tracker

    accelerator, model, opt, loader, sched = prepared(
        scheduler=lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.05, total_steps=100)
    )
    train(accelerator, model, opt, loader, sched)
    monkeypatch.setattr(sys, "last_value", RuntimeError("the script died"), raising=False)
    _tracker.TRACKER.emit("finish")
    assert codes(guard_on) == []
    monkeypatch.undo()
    _tracker.TRACKER.emit("finish")  # judged now, so not again when pytest exits
    assert codes(guard_on) == ["ACL310"]


# -- Engine loops ---------------------------------------------------------------------------------


def test_the_guard_engine_loop_is_clean_with_every_check_on(guard_on):
    from guard import Engine

    engine = Engine(gradient_accumulation_steps=N)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    model, opt, loader, sched = engine.prepare(model, opt, make_loader(10), sched)
    for _ in range(2):
        for batch in loader:
            with engine.accumulate(model):
                engine.backward(mse(model, batch))
                if engine.sync_gradients:
                    engine.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
    assert [c for c in codes(guard_on) if c != "ACL307"] == []  # the engine notes its tail
