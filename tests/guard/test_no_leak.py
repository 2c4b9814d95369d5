"""The guard keeps no training object alive: after a loop ends and its objects go out of scope,
the optimizer, the GradScaler and the model are collected (a sweep of many runs in one process
must not grow)."""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn


def _one_fp16_run():
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(8, 4)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return [weakref.ref(obj) for obj in (model, optimizer, scaler)]


def test_training_objects_are_collected_after_the_run(guard_on):
    refs = _one_fp16_run()
    gc.collect()
    assert [ref() is None for ref in refs] == [True, True, True]
