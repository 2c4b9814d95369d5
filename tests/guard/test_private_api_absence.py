"""Private torch state sits behind feature tests: simulating its absence turns the dependent
checks into a one-time warning while every other check keeps working."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from guard import _private


@pytest.fixture
def without_private(monkeypatch):
    _private.probe()
    monkeypatch.setitem(_private.FEATURES, "scaler_stage", False)
    monkeypatch.setitem(_private.FEATURES, "scaler_scale", False)
    _private.reset_warnings()
    yield
    _private.reset_warnings()


def _amp_setup():
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, torch.amp.GradScaler("cpu"), torch.randn(4, 8), torch.randn(4, 1)


def test_probe_finds_the_private_state_on_this_torch():
    assert _private.probe() == {"scaler_stage": True, "scaler_scale": True}


def test_missing_scaler_stage_degrades_acl103_to_one_warning(guard_on, without_private):
    model, optimizer, scaler, x, y = _amp_setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            scaler.scale(F.mse_loss(model(x), y)).backward()
            try:
                scaler.step(optimizer)  # second round: torch's own error, no ACL103
            except RuntimeError as exc:
                assert not isinstance(exc, guard_on.GuardError)
                assert "already been called" in str(exc)
    notes = [str(w.message) for w in caught if "skipped, the other checks" in str(w.message)]
    assert len([n for n in notes if "ACL103" in n]) == 1
    assert "ACL103" not in {f.code for f in guard_on.findings()}


def test_other_checks_keep_working_without_private_state(guard_on, without_private):
    model, optimizer, scaler, x, y = _amp_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler.scale(F.mse_loss(model(x), y)).backward()
        with pytest.raises(guard_on.GuardError) as info:
            optimizer.step()  # ACL102 uses only public hooks
        assert info.value.code == "ACL102"
        F.mse_loss(model(x), y).backward()
        with pytest.raises(guard_on.GuardError) as info:
            scaler.unscale_(optimizer)  # ACL101 falls back to the backward counters
        assert info.value.code == "ACL101"
