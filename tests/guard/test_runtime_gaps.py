"""Runtime signals the catalogue names beyond the first guard checks: the unscaled loss flag of
ACL601 in plain loops and the scaler's found-inf record for ACL603."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn


def _setup(fp16: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=fp16)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    return model, optimizer, scaler, x, y


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


# -- ACL601: the unscaled loss in a plain loop ----------------------------------------------------


def test_acl601_nan_loss_with_finite_gradients_raises_before_the_step(guard_on):
    model, optimizer, _, x, y = _setup()
    nan_term = torch.tensor(float("nan"))  # detached: the gradients stay finite
    for _ in range(2):  # two micro-steps, the second loss is the bad one
        loss = F.mse_loss(model(x), y) / 2
        (loss if _ == 0 else loss + nan_term).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    before = _params(model)
    with pytest.raises(guard_on.GuardError, match="loss passed to backward") as info:
        optimizer.step()
    assert info.value.code == "ACL601"
    assert _same(before, _params(model))


def test_acl601_finite_losses_over_many_steps_train_like_an_unguarded_loop(guard_on):
    model, optimizer, _, x, y = _setup()
    reference, ref_opt, _, _, _ = _setup()
    for _ in range(5):
        for m, opt in ((model, optimizer), (reference, ref_opt)):
            opt.zero_grad()
            for half in (x[:8], x[8:]):
                F.mse_loss(m(half), y[: len(half)]).backward()
            opt.step()
    assert guard_on.findings() == []
    assert _same(_params(model), _params(reference))


def test_acl601_a_bad_loss_is_forgotten_after_zero_grad(guard_on):
    model, optimizer, _, x, y = _setup()
    (F.mse_loss(model(x), y) + torch.tensor(float("inf"))).backward()
    optimizer.zero_grad()  # the user dropped that batch
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    assert guard_on.findings() == []


# -- ACL603: the scaler's found-inf record -------------------------------------------------------


def _overflowing_steps(scaler, n: int, new_scale: float | None = None):
    model, optimizer, _, x, y = _setup()
    for _ in range(n):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y) * float("inf")  # overflows at any scale
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update(new_scale)
    return model


def test_acl603_counts_skips_the_scale_cannot_show(guard_on):
    """With an explicit `update(new_scale)` the scale never drops; the scaler's found-inf record
    still shows each skipped step."""
    guard_on.configure(overflow_streak=4)
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(guard_on.GuardError) as info:
        _overflowing_steps(scaler, 6, new_scale=1024.0)
    assert info.value.code == "ACL603"
    assert "4 optimizer steps in a row" in str(info.value)
    assert scaler.get_scale() == 1024.0


def test_acl603_found_inf_without_private_state_degrades_to_the_scale_drop(guard_on, monkeypatch):
    from guard import _private

    _private.probe()
    monkeypatch.setitem(_private.FEATURES, "scaler_stage", False)
    guard_on.configure(overflow_streak=4)
    _overflowing_steps(torch.amp.GradScaler("cpu"), 6, new_scale=1024.0)  # invisible: no raise
    with pytest.raises(guard_on.GuardError) as info:
        _overflowing_steps(torch.amp.GradScaler("cpu"), 6)  # the scale drop still counts
    assert info.value.code == "ACL603"
    _private.reset_warnings()


def test_acl603_finite_fp16_steps_are_not_skips(guard_on):
    guard_on.configure(overflow_streak=1)
    model, optimizer, _, x, y = _setup()
    scaler = torch.amp.GradScaler("cpu")
    before = _params(model)
    for _ in range(4):
        optimizer.zero_grad()
        scaler.scale(F.mse_loss(model(x), y)).backward()
        scaler.step(optimizer)
        scaler.update(65536.0)
    assert guard_on.findings() == []
    assert not _same(before, _params(model))
