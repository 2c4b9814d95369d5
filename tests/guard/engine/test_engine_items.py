"""Token-count normalisation: backward(loss_sum, num_items=n) gives the exact large-batch mean."""

from __future__ import annotations

import pytest
from engine_reference import (
    DEVICES,
    flat_params,
    make_token_batches,
    make_token_model,
    rel_err,
    token_loss,
    token_reference,
)

import guard

N, STEPS = 4, 3


def _engine_tokens(device: str, batches: list, use_items: bool):
    import torch

    engine = guard.Engine("no", gradient_accumulation_steps=N, device=device)
    model = make_token_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.5))
    for tokens, labels in batches:
        tokens, labels = tokens.to(device), labels.to(device)
        with engine.accumulate(model):
            if use_items:
                loss = token_loss(model, tokens, labels, "sum")
                engine.backward(loss, num_items=(labels != -100).sum())
            else:
                engine.backward(token_loss(model, tokens, labels, "mean"))
            opt.step()
            opt.zero_grad()
    return flat_params(model)


@pytest.mark.parametrize("device", DEVICES)
def test_num_items_gives_the_full_batch_token_mean(device):
    batches = make_token_batches(N * STEPS)
    want = token_reference(batches, STEPS, N)
    assert rel_err(_engine_tokens(device, batches, use_items=True), want) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore:ACL308:guard.GuardWarning")  # rightly; see test_engine_checks
def test_mean_of_means_is_biased_where_num_items_is_not(device):
    """The contrast that makes the first test meaningful: the sum-of-means error is real."""
    batches = make_token_batches(N * STEPS)
    want = token_reference(batches, STEPS, N)
    start = flat_params(make_token_model())
    biased = _engine_tokens(device, batches, use_items=False)
    exact = _engine_tokens(device, batches, use_items=True)
    assert rel_err(biased - start, want - start) > 0.05
    assert rel_err(exact - start, want - start) <= 1e-5


def test_plain_backward_cannot_join_a_num_items_window():
    import torch

    engine = guard.Engine("no", gradient_accumulation_steps=N)
    model = make_token_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.5))
    tokens, labels = make_token_batches(1)[0]
    with engine.accumulate(model):
        engine.backward(token_loss(model, tokens, labels, "sum"), num_items=5)
    with engine.accumulate(model), pytest.raises(ValueError, match="num_items"):
        engine.backward(token_loss(model, tokens, labels, "mean"))
