"""In raise mode each error comes before the damage: parameters, gradients and the scaler are
exactly as they were when the GuardError is raised."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

GUARD_LINE_MARK = "test_raise_before_damage.py:"


def _setup(fp16: bool = True, lr: float = 0.1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", enabled=fp16)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    return model, optimizer, scaler, x, y


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_acl102_raises_before_the_optimizer_changes_parameters(guard_on):
    model, optimizer, scaler, x, y = _setup()
    scaler.scale(F.mse_loss(model(x), y)).backward()
    before = _params(model)
    with pytest.raises(guard_on.GuardError) as info:
        optimizer.step()
    assert info.value.code == "ACL102"
    assert GUARD_LINE_MARK in info.value.location
    assert "65536" in str(info.value)
    assert _same(before, _params(model))


def test_acl101_raw_scaler_loop_raises_before_torchs_scale_assertion(guard_on):
    model, optimizer, scaler, x, y = _setup()
    F.mse_loss(model(x), y).backward()  # never scaled
    before = _params(model)
    with pytest.raises(guard_on.GuardError) as info:
        scaler.step(optimizer)
    assert info.value.code == "ACL101"
    assert _same(before, _params(model))
    # Without the guard torch would fail with its own assertion at the same call.
    guard_on.configure(mode="off")
    with pytest.raises(AssertionError, match="_scale is None"):
        scaler.step(optimizer)


def test_acl101_partly_unscaled_window(guard_on):
    model, optimizer, scaler, x, y = _setup()
    scaler.scale(F.mse_loss(model(x), y)).backward()
    F.mse_loss(model(x), y).backward()  # this contribution would be divided by 65536
    with pytest.raises(guard_on.GuardError, match="1 of 2 backward passes") as info:
        scaler.unscale_(optimizer)
    assert info.value.code == "ACL101"


def test_acl104_raises_at_the_clip_call_before_gradients_change(guard_on):
    model, optimizer, scaler, x, y = _setup()
    scaler.scale(F.mse_loss(model(x), y)).backward()
    grads = _grads(model)
    with pytest.raises(guard_on.GuardError) as info:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert info.value.code == "ACL104"
    assert _same(grads, _grads(model))
    scaler.unscale_(optimizer)  # the right order is accepted
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    assert guard_on.findings()[0].code == "ACL104" and len(guard_on.findings()) == 1


def test_acl103_names_the_previous_step_instead_of_torchs_error(guard_on):
    model, optimizer, scaler, x, y = _setup()
    scaler.scale(F.mse_loss(model(x), y)).backward()
    scaler.step(optimizer)  # previous step, no update
    optimizer.zero_grad()
    with pytest.raises(guard_on.GuardError, match="starts a new iteration"):
        scaler.scale(F.mse_loss(model(x), y)).backward()  # ACL103's earlier signal
    before = _params(model)
    with pytest.raises(guard_on.GuardError) as info:
        scaler.step(optimizer)
    assert info.value.code == "ACL103"
    assert GUARD_LINE_MARK in str(info.value)  # names where the previous step ran
    assert _same(before, _params(model))


def test_acl601_raises_before_a_nan_reaches_the_weights(guard_on):
    model, optimizer, _, x, y = _setup(fp16=False)
    x[3, 2] = float("nan")
    F.mse_loss(model(x), y).backward()
    before = _params(model)
    with pytest.raises(guard_on.GuardError, match="gradient norm is nan") as info:
        optimizer.step()
    assert info.value.code == "ACL601"
    assert _same(before, _params(model))


def test_acl601_skip_policy_clears_the_step_and_training_goes_on(guard_on):
    guard_on.configure(nonfinite_policy="skip")
    try:
        model, optimizer, _, x, y = _setup(fp16=False)
        bad = x.clone()
        bad[3, 2] = float("nan")
        before = _params(model)
        F.mse_loss(model(bad), y).backward()
        optimizer.step()  # skipped: gradients cleared, no raise
        assert _same(before, _params(model))
        F.mse_loss(model(x), y).backward()
        optimizer.step()  # a clean batch trains as usual
        assert not _same(before, _params(model))
        assert all(torch.isfinite(p).all() for p in model.parameters())
        (finding,) = guard_on.findings()
        assert (finding.code, finding.level) == ("ACL601", "warning")
    finally:
        guard_on.configure(nonfinite_policy="raise")


def test_acl601_reports_a_non_finite_gradient_with_a_finite_loss(guard_on):
    model, optimizer, _, x, y = _setup(fp16=False)
    F.mse_loss(model(x), y).backward()
    next(model.parameters()).grad[0, 0] = float("inf")
    with pytest.raises(guard_on.GuardError, match="gradient norm is inf"):
        optimizer.step()


def test_acl601_reuses_the_clip_norm_and_sees_clipped_nan(guard_on):
    model, optimizer, _, x, y = _setup(fp16=False)
    F.mse_loss(model(x), y).backward()
    next(model.parameters()).grad[0, 0] = float("nan")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert torch.isnan(norm)
    with pytest.raises(guard_on.GuardError, match="gradient norm is nan"):
        optimizer.step()


def test_acl601_nan_loss_under_a_scaler_is_a_warning_the_scaler_skips(guard_on):
    model, optimizer, scaler, x, y = _setup()
    x[0, 0] = float("nan")
    before = _params(model)
    scaler.scale(F.mse_loss(model(x), y)).backward()
    scaler.step(optimizer)  # skipped by the scaler: no raise, only a warning-level finding
    scaler.update()
    (finding,) = guard_on.findings()
    assert (finding.code, finding.level) == ("ACL601", "warning")
    assert _same(before, _params(model))


def test_acl603_raises_when_the_scale_collapses(guard_on):
    model, optimizer, scaler, x, y = _setup()
    guard_on.configure(overflow_streak=5)
    with pytest.raises(guard_on.GuardError) as info:
        for _ in range(10):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y) * float("inf")  # overflows at any scale
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    assert info.value.code == "ACL603"
    assert "5 optimizer steps in a row" in str(info.value)
    assert scaler.get_scale() == 65536.0 / 2**5


def test_acl108_original_optimizer_after_prepare_raises_before_the_step(guard_on):
    from accelerate import Accelerator

    model, optimizer, _, x, y = _setup(fp16=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, prepared = accelerator.prepare(model, optimizer)
    with accelerator.accumulate(model):
        accelerator.backward(F.mse_loss(model(x), y))
    before = _params(model)
    with pytest.raises(guard_on.GuardError) as info:
        optimizer.step()
    assert info.value.code == "ACL108"
    assert _same(before, _params(model))
    prepared.step()  # the prepared one is fine
    assert len(guard_on.findings()) == 1


def test_acl101_raw_backward_under_accelerate_raises_at_the_backward(guard_on):
    from accelerate import Accelerator

    model, optimizer, _, x, y = _setup(fp16=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer = accelerator.prepare(model, optimizer)
    with accelerator.accumulate(model):
        with pytest.raises(guard_on.GuardError, match="1/4 division") as info:
            F.mse_loss(model(x), y).backward()
    assert info.value.code == "ACL101"


def test_warn_mode_never_raises_and_counts(guard_on):
    guard_on.configure(mode="warn")
    model, optimizer, scaler, x, y = _setup()
    for _ in range(3):
        optimizer.zero_grad()
        scaler.scale(F.mse_loss(model(x), y)).backward()
        optimizer.step()
    (finding,) = guard_on.findings()
    assert (finding.code, finding.count) == ("ACL102", 3)
    assert GUARD_LINE_MARK in finding.location
    assert "ACL102" in guard_on.summary_text()


def test_select_and_ignore_like_the_linter(guard_on):
    model, optimizer, scaler, x, y = _setup()
    guard_on.configure(select=["ACL"], ignore=["ACL10"])
    scaler.scale(F.mse_loss(model(x), y)).backward()
    optimizer.step()  # ACL102 ignored by prefix
    guard_on.configure(ignore=[], select=["ACL2", "ACL102"])
    optimizer.zero_grad()
    scaler.scale(F.mse_loss(model(x), y)).backward()
    with pytest.raises(guard_on.GuardError):
        optimizer.step()


def test_correct_amp_loop_trains_identically_with_checks_on(guard_on):
    """A correct AMP loop trains to the same bytes with the checks on as with them off."""

    def train() -> list[torch.Tensor]:
        model, optimizer, scaler, x, y = _setup()
        sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
        for _ in range(4):
            optimizer.zero_grad()
            scaler.scale(F.mse_loss(model(x), y)).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            sched.step()
        return _params(model)

    guarded = train()
    guard_on.configure(mode="off")
    assert _same(guarded, train())
    assert guard_on.findings() == []
