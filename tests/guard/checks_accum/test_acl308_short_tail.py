"""ACL308 measures token means whose counts differ because targets were ignored (padding,
-100 labels). A sequence-classification loop whose micro-batches differ only by the short last
batch of the epoch (70 samples at batch 4: a tail of 2) weighs its samples as any loop without
accumulation does: silent. The same tail with padded token targets is still measured."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import codes  # noqa: E402

N = 4


def _loop(padded: bool) -> None:
    torch.manual_seed(0)
    ids = torch.randint(1, 16, (70, 6))
    labels = ids.clone() if padded else torch.randint(0, 2, (70,))
    if padded:
        labels[::2, 2:] = -100  # every other sequence is short
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16 if padded else 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(ids, labels), batch_size=4)
    for i, (x, y) in enumerate(loader):
        out = model(x)
        logits = out.flatten(0, 1) if padded else out.mean(1)
        (nn.functional.cross_entropy(logits, y.flatten()) / N).backward()
        if (i + 1) % N == 0 or i + 1 == len(loader):
            opt.step()
            opt.zero_grad()


def test_sequence_classification_with_a_short_last_batch_is_silent(guard_on):
    _loop(padded=False)
    assert codes(guard_on) == []


def test_padded_token_targets_in_the_same_loop_are_measured(guard_on):
    guard_on.configure(mode="warn")
    _loop(padded=True)
    assert codes(guard_on) == ["ACL308"]
