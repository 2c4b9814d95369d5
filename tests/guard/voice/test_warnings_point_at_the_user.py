"""No warning anyone sees points inside the guard, and the guard emits no deprecation warnings
of its own: torch's warnings raised under the guard's wrappers are shown at the user's line."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

GUARD_DIR = str(Path(__file__).resolve().parents[3] / "guard")


def _in_guard(caught) -> list[str]:
    return [f"{w.filename}:{w.lineno}" for w in caught if w.filename.startswith(GUARD_DIR)]


def test_torchs_scheduler_order_warning_points_at_the_users_line(guard_on):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    guard_on.configure(select=["ACL6"])  # ACL305 has its own tests; this one is torch's warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler.step()  # before any optimizer step: torch warns about the order
        line = _line_of("scheduler.step()  # before")
    order = [w for w in caught if "before `optimizer.step()`" in str(w.message)]
    assert [(Path(w.filename).name, w.lineno) for w in order] == [(Path(__file__).name, line)]
    assert _in_guard(caught) == []


def test_a_deprecated_epoch_argument_is_warned_at_the_users_line(guard_on):
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    guard_on.configure(select=["ACL6"])
    model(torch.randn(3, 2)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler.step(1)
        line = _line_of("scheduler.step(1)")
    assert caught and _in_guard(caught) == []
    assert {(Path(w.filename).name, w.lineno) for w in caught} == {(Path(__file__).name, line)}


def test_naming_a_non_finite_gradient_warns_nothing_of_its_own(guard_on):
    pytest.importorskip("torch.distributed")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
    model[1].weight.grad[0, 0] = float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(guard_on.GuardError) as error:
            optimizer.step()  # the parameter is named by a walk over the live modules
    assert "`1.weight`" in error.value.message
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
    assert [str(w.message) for w in caught if "reduce_op" in str(w.message)] == []


def _line_of(text: str) -> int:
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    return 1 + next(i for i, line in enumerate(lines) if text in line and "_line_of" not in line)
