"""An exception raised inside the user's forward or backward while the guard's hooks are active:
the next correct step gets no finding, and `guard.uninstall()` leaves nothing behind (torch then
trains to the same bytes as a run that never saw the guard)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import optimizer as optim_mod

from guard import _patch
from guard._tracker import TRACKER


class Flaky(nn.Module):
    """Raises in forward (inside autocast) or in backward when told to."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 6)
        self.head = nn.Linear(6, 1)
        self.fail_forward = self.fail_backward = False

    def forward(self, x):
        hidden = self.body(x)
        if self.fail_forward:
            raise ValueError("bad batch in forward")
        if self.fail_backward:
            hidden = _FailingBackward.apply(hidden)
        return self.head(torch.tanh(hidden))


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("bad kernel in backward")


def _step(model, optimizer, scaler, x, y):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()


def _run(failures: bool):
    """Four fp16 steps; with `failures`, a forward and a backward raise (and are caught) first."""
    torch.manual_seed(0)
    model = Flaky()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(8, 6), torch.randn(8, 1)
    if failures:
        for flag, error in (("fail_forward", ValueError), ("fail_backward", RuntimeError)):
            setattr(model, flag, True)
            with pytest.raises(error):
                _step(model, optimizer, scaler, x, y)
            setattr(model, flag, False)
    for _ in range(4):
        _step(model, optimizer, scaler, x, y)
    return model, [p.detach().clone() for p in model.parameters()]


def _global_hooks() -> tuple[int, int]:
    return len(optim_mod._global_optimizer_pre_hooks), len(optim_mod._global_optimizer_post_hooks)


def test_failures_in_forward_and_backward_leave_nothing_after_uninstall(guard_on):
    guard_on.configure(select=["ACL"])  # every check watches the failing steps
    guarded_model, guarded = _run(failures=True)
    assert guard_on.findings() == []  # the steps after the failures are correct
    assert TRACKER.autocast_stack == [] and TRACKER.backward_depth == 0

    guard_on.uninstall()
    try:
        assert not _patch.active()
        assert _global_hooks() == (0, 0)
        assert not any(p._post_accumulate_grad_hooks for p in guarded_model.parameters())
        assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()
        assert not torch.is_anomaly_enabled()
        assert torch.autograd.backward.__module__ == "torch.autograd"
        _, plain = _run(failures=True)
        _, reference = _run(failures=False)
        for a, b, c in zip(reference, plain, guarded, strict=True):
            assert torch.equal(a, b) and torch.equal(a, c)
    finally:
        guard_on.install()
