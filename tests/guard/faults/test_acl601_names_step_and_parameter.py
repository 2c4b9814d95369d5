"""ACL601 names the optimizer step and the first parameter (by its name in the model) whose
gradient is not finite, and no weight changes before it is raised."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

HELP = "accel-lint --explain ACL601"
REFUSED = "this step would write inf/NaN into every weight it updates"


def _setup():
    torch.manual_seed(0)
    layers = OrderedDict(embed=nn.Linear(4, 8), act=nn.Tanh(), head=nn.Linear(8, 1))
    model = nn.Sequential(layers)
    return (
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.randn(16, 4),
        torch.randn(16, 1),
    )


def _snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def _message(error) -> str:
    return error.value.message.split(f" ({HELP})")[0]


def test_an_inf_gradient_names_the_step_and_the_parameter(guard_on):
    model, optimizer, x, y = _setup()
    for _ in range(2):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    model.head.weight.grad[0, 3] = float("inf")  # a bad kernel in the last layer only
    before = _snapshot(model)
    with pytest.raises(guard_on.GuardError) as error:
        optimizer.step()
    assert error.value.code == "ACL601"
    assert _message(error).startswith(
        "optimizer step 3: the total gradient norm is inf (a non-finite loss or gradient); "
        f"the first parameter with a non-finite gradient is `head.weight`: {REFUSED}"
    )
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(model), strict=True))


def test_a_nan_loss_names_the_step_and_the_first_parameter(guard_on):
    model, optimizer, x, y = _setup()
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
    x[5, 1] = float("nan")  # a corrupt sample: every gradient is NaN
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    with pytest.raises(guard_on.GuardError) as error:
        optimizer.step()
    assert _message(error).startswith(
        "optimizer step 2: a loss passed to backward since the last step was inf/NaN and the "
        "total gradient norm is nan; the first parameter with a non-finite gradient is "
        f"`embed.weight`: {REFUSED}"
    )


def test_an_inf_loss_with_finite_gradients_names_the_step_only(guard_on):
    model, optimizer, x, y = _setup()
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y) + torch.tensor(float("inf"))  # a detached inf term
    loss.backward()
    with pytest.raises(guard_on.GuardError) as error:
        optimizer.step()
    assert _message(error).startswith(
        f"optimizer step 1: a loss passed to backward since the last step was inf/NaN: {REFUSED}"
    )


def test_a_model_held_by_a_trainer_is_named_from_its_root(guard_on):
    """The model sits in a trainer object: the name is the model's own, not the trainer's."""

    class Trainer:
        def __init__(self):
            self.model, self.optimizer, self.x, self.y = _setup()

    trainer = Trainer()
    F.mse_loss(trainer.model(trainer.x), trainer.y).backward()
    trainer.model.embed.bias.grad[2] = float("nan")
    with pytest.raises(guard_on.GuardError) as error:
        trainer.optimizer.step()
    assert "the first parameter with a non-finite gradient is `embed.bias`" in _message(error)
