"""ACL601 with sparse gradients (`nn.Embedding(sparse=True)` trained by SparseAdam beside a dense
optimizer, as recommendation models do): the step-time norm must read them, not crash."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn


def _recsys():
    torch.manual_seed(0)
    embedding = nn.Embedding(50, 8, sparse=True)
    head = nn.Linear(8, 1)
    sparse_opt = torch.optim.SparseAdam(list(embedding.parameters()), lr=0.01)
    dense_opt = torch.optim.Adam(head.parameters(), lr=0.01)
    return embedding, head, sparse_opt, dense_opt


def _train(embedding, head, sparse_opt, dense_opt, poison_at=None) -> None:
    generator = torch.Generator().manual_seed(1)
    for step in range(4):
        ids = torch.randint(0, 50, (16,), generator=generator)
        target = torch.randn(16, 1, generator=generator)
        loss = F.mse_loss(head(embedding(ids)), target)
        if step == poison_at:
            loss = loss * float("nan")
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        sparse_opt.zero_grad()
        dense_opt.zero_grad()


def test_sparse_and_dense_optimizers_train_silently(guard_on):
    guard_on.configure(select=["ACL"])
    _train(*_recsys())
    assert guard_on.findings() == []


def test_a_nan_in_sparse_gradients_is_stopped_before_the_sparse_step(guard_on):
    embedding, head, sparse_opt, dense_opt = _recsys()
    with pytest.raises(guard_on.GuardError) as info:
        _train(embedding, head, sparse_opt, dense_opt, poison_at=2)
    assert info.value.code == "ACL601"
    assert torch.isfinite(embedding.weight).all()  # the poisoned step changed nothing
