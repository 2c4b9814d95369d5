"""ACL304 and deliberate drops: zeroing a window whose gradients hold inf/NaN throws away poison,
not training data; zeroing finite gradients inside a window is still the bug."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

N = 4
POISONED = 6  # the micro-batch with a NaN sample: the third of the second window


def _model_and_batches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(12 * 4, 8), torch.randn(12 * 4, 1)
    batches = [(x[i : i + 4].clone(), y[i : i + 4]) for i in range(0, len(x), 4)]
    batches[POISONED][0][1, 3] = float("nan")
    return model, optimizer, batches


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _gradients_finite(model: nn.Module) -> bool:
    return all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _reference(skipped: set[int]) -> list[torch.Tensor]:
    """The same windows and steps with the dropped micro-batches never fed to the model."""
    model, optimizer, batches = _model_and_batches()
    for i, (x, y) in enumerate(batches):
        if i not in skipped:
            (F.mse_loss(model(x), y) / N).backward()
        if (i + 1) % N == 0:
            optimizer.step()
            optimizer.zero_grad()
    return _params(model)


def test_dropping_a_window_with_non_finite_gradients_is_silent(guard_on):
    guard_on.configure(select=["ACL"])  # every check: a deliberate drop trips none
    model, optimizer, batches = _model_and_batches()
    for i, (x, y) in enumerate(batches):
        (F.mse_loss(model(x), y) / N).backward()
        if not _gradients_finite(model):
            optimizer.zero_grad()  # the window so far is poisoned: drop it
        if (i + 1) % N == 0:
            optimizer.step()
            optimizer.zero_grad()
    assert guard_on.findings() == []
    assert all(torch.isfinite(p).all() for p in model.parameters())
    window_start = POISONED - POISONED % N
    expected = _reference(set(range(window_start, POISONED + 1)))  # the window so far
    assert all(torch.equal(a, b) for a, b in zip(_params(model), expected, strict=True))


def test_skipping_on_a_nan_loss_after_backward_is_silent(guard_on):
    guard_on.configure(select=["ACL"])
    model, optimizer, batches = _model_and_batches()
    for i, (x, y) in enumerate(batches):
        loss = F.mse_loss(model(x), y) / N
        loss.backward()
        if torch.isnan(loss):
            optimizer.zero_grad()
            continue
        if (i + 1) % N == 0:
            optimizer.step()
            optimizer.zero_grad()
    assert guard_on.findings() == []


def test_zeroing_finite_gradients_inside_a_window_still_raises(guard_on):
    guard_on.configure(select=["ACL"])
    model, optimizer, batches = _model_and_batches()
    grads = []
    with pytest.raises(guard_on.GuardError) as info:
        for i, (x, y) in enumerate(batches[:POISONED]):  # finite data only
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            optimizer.zero_grad()  # every micro-batch: the bug
            (F.mse_loss(model(x), y) / N).backward()
            if (i + 1) % N == 0:
                optimizer.step()
    assert info.value.code == "ACL304"
    assert "discards the gradients of 1 micro-batch" in str(info.value)
    assert i == 2  # one discard before the first step is allowed (a sanity-check backward)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
