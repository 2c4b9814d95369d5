"""Two gloo processes on CPU for the ACL401/404/405 tests: run as a script, prints one JSON line
per rank with what the guard reported (raise mode) in three DDP loops."""

from __future__ import annotations

import json
import os
import socket
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

N = 4


def _model():
    torch.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))


def _batches(rank: int):
    generator = torch.Generator().manual_seed(rank)
    return [(torch.randn(4, 8, generator=generator), torch.randn(4, 1, generator=generator))] * N


def bypass_via_module(rank: int, guard) -> dict:
    """ACL405: forward through model.module; the error must come before the step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batches(rank)[0]
    nn.functional.mse_loss(model.module(x), y).backward()
    before = [p.detach().clone() for p in model.parameters()]
    try:
        opt.step()
        return {"raised": None}
    except guard.GuardError as error:
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        return {"raised": error.code, "unchanged": unchanged, "message": str(error)}


def accumulate(rank: int, guard, use_no_sync: bool) -> list:
    """ACL401 when no_sync() is missing (a warning); nothing when it covers the forward."""
    guard.reset()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_batches(rank)):
        last = (i + 1) % N == 0
        with nullcontext() if last or not use_no_sync else model.no_sync():
            (nn.functional.mse_loss(model(x), y) / N).backward()
        if last:
            opt.step()
            opt.zero_grad()
    return [(f.code, f.level, f.message) for f in guard.findings()]


def sampler_epochs(guard, set_epoch: bool) -> list:
    """ACL404 when a shuffling DistributedSampler starts two passes with the same epoch."""
    from torch.utils.data.distributed import DistributedSampler

    guard.reset()
    sampler = DistributedSampler(list(range(32)), shuffle=True)
    for epoch in range(2):
        if set_epoch:
            sampler.set_epoch(epoch)
        list(iter(sampler))
    return [(f.code, f.level) for f in guard.findings()]


def multigpu_trainer(guard, set_epoch: bool) -> list:
    """PyTorch's DDP example (`multigpu.py`): each epoch peeks one batch to print the batch
    size, then calls `set_epoch`, then loops. The peek is a pass the sampler never finishes."""
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    guard.reset()
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    train_data = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=True))
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        b_sz = len(next(iter(train_data))[0])
        assert b_sz == 4
        if set_epoch:
            train_data.sampler.set_epoch(epoch)
        for source, targets in train_data:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(source), targets).backward()
            optimizer.step()
    return [(f.code, f.level) for f in guard.findings()]


def ddp_copies(guard) -> dict:
    """A trained DDP model under the guard survives deepcopy, a whole-model `torch.save` and a
    `state_dict()` round trip: each copy computes what the original computes."""
    import copy
    import io

    guard.reset()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    with torch.no_grad():
        expected = model(x)
        copied = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        fresh = _model()
        fresh.load_state_dict(model.state_dict())
        same = [torch.equal(expected, other(x)) for other in (copied, loaded, fresh)]
    return {"same": same, "findings": [f.code for f in guard.findings()]}


def run(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import guard

    guard.install()
    guard.configure(mode="raise", select=["ACL"])
    result = {
        "rank": rank,
        "bypass": bypass_via_module(rank, guard),
        "no_sync_missing": accumulate(rank, guard, use_no_sync=False),
        "no_sync_used": accumulate(rank, guard, use_no_sync=True),
        "same_epoch": sampler_epochs(guard, set_epoch=False),
        "set_epoch": sampler_epochs(guard, set_epoch=True),
        "multigpu_peek": multigpu_trainer(guard, set_epoch=True),
        "multigpu_peek_no_set_epoch": multigpu_trainer(guard, set_epoch=False),
        "ddp_copies": ddp_copies(guard),
    }
    # One file per rank: two ranks printing to one pipe can interleave their lines.
    out = os.path.join(os.environ["ACCEL_DDP_RESULTS"], f"rank{rank}.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(2, free), nprocs=2)
    sys.exit(0)
