"""ACL601 under a GradScaler tells a real NaN loss from an overflow that enters the loss through
scaled gradients (PyTorch's gradient-penalty recipe), and option `anomaly` turns autograd's anomaly
mode on after the first finding so the next NaN names its operation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

HERE = "test_acl601_scaled_penalty_and_anomaly.py"


def _setup(init_scale: float = 2.0**20):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return model, optimizer, scaler, torch.randn(16, 8), torch.randn(16, 1)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def _gradient_penalty_steps(model, optimizer, scaler, x, y, steps: int, bug=1.0) -> list[bool]:
    """The recipe of PyTorch's AMP examples ("Gradient penalty"); returns, per step, whether the
    penalty was non-finite."""
    non_finite = []
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), y)
        scaled = torch.autograd.grad(scaler.scale(loss), model.parameters(), create_graph=True)
        inv_scale = 1.0 / scaler.get_scale()
        grads = [g * inv_scale for g in scaled]
        with torch.autocast("cpu", dtype=torch.float16):
            penalty = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
            loss = loss + penalty * bug
        non_finite.append(not bool(torch.isfinite(penalty.detach())))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return non_finite


def test_gradient_penalty_with_overflowing_scaled_gradients_is_the_scalers_business(guard_on):
    guard_on.configure(select=["ACL"])
    reference, ref_opt, ref_scaler, x, y = _setup()
    guard_on.configure(mode="off")
    _gradient_penalty_steps(reference, ref_opt, ref_scaler, x, y, 8)
    guard_on.configure(mode="raise")
    model, optimizer, scaler, x, y = _setup()
    start = _params(model)
    non_finite = _gradient_penalty_steps(model, optimizer, scaler, x, y, 8)
    assert non_finite[:2] == [True, True]  # NaN penalties at scales 2**20 and 2**19
    assert guard_on.findings() == []
    assert scaler.get_scale() < 2.0**20 and not _same(start, _params(model))
    assert _same(_params(model), _params(reference))


def test_gradient_penalty_on_a_nan_loss_is_still_reported(guard_on):
    model, optimizer, scaler, x, y = _setup(init_scale=1024.0)
    x[2, 5] = float("nan")
    start = _params(model)
    _gradient_penalty_steps(model, optimizer, scaler, x, y, 1)
    (finding,) = guard_on.findings()
    assert (finding.code, finding.level) == ("ACL601", "warning")
    assert "NaN before loss scaling" in finding.message
    assert _same(start, _params(model))  # the scaler skipped the step


def test_a_penalty_that_is_nan_at_every_scale_ends_in_an_overflow_streak(guard_on):
    """A NaN entering through the penalty is left to the scaler; when it is not an overflow, the
    steps keep being skipped and ACL603 reports the streak."""
    guard_on.configure(overflow_streak=3)
    model, optimizer, scaler, x, y = _setup(init_scale=1024.0)
    start = _params(model)
    with pytest.raises(guard_on.GuardError) as info:
        _gradient_penalty_steps(model, optimizer, scaler, x, y, 5, bug=float("nan"))
    assert info.value.code == "ACL603"
    assert "3 optimizer steps in a row" in str(info.value)
    assert [f.code for f in guard_on.findings()] == ["ACL603"]
    assert _same(start, _params(model))


def _nan_in_backward(model, x, y) -> torch.Tensor:
    """A finite loss whose backward makes NaN: sqrt at 0 gives inf, times 0 in pow's backward."""
    out = model(x)
    return F.mse_loss(out, y) + (out - out.detach()).pow(2).sum().sqrt()


@pytest.fixture
def anomaly_mode_restored():
    yield
    torch.autograd.set_detect_anomaly(False)


def test_anomaly_option_names_the_operation_at_the_next_occurrence(guard_on, anomaly_mode_restored):
    guard_on.configure(anomaly=1, nonfinite_policy="skip")
    model, optimizer, _, x, y = _setup()
    start = _params(model)
    _nan_in_backward(model, x, y).backward()
    assert not torch.is_anomaly_enabled()
    optimizer.step()  # first finding: skipped, anomaly mode on from here
    (finding,) = guard_on.findings()
    assert "anomaly mode is on from now" in finding.message
    assert torch.is_anomaly_enabled() and _same(start, _params(model))
    optimizer.zero_grad()
    with pytest.warns(UserWarning, match=HERE), pytest.raises(RuntimeError) as info:
        _nan_in_backward(model, x, y).backward()
    assert "PowBackward0" in str(info.value) and not isinstance(info.value, guard_on.GuardError)
    guard_on.uninstall()  # turns anomaly mode off again
    try:
        assert not torch.is_anomaly_enabled()
    finally:
        guard_on.install()


def test_without_the_option_anomaly_mode_stays_off(guard_on):
    model, optimizer, _, x, y = _setup()
    _nan_in_backward(model, x, y).backward()
    with pytest.raises(guard_on.GuardError, match="ACCEL_GUARD_ANOMALY=1") as info:
        optimizer.step()
    assert info.value.code == "ACL601"
    assert not torch.is_anomaly_enabled()
