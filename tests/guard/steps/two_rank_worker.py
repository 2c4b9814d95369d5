"""Two gloo processes on CPU (one process group, started once): run as a script; each rank writes
a JSON file with what the guard (raise mode) did in
- ACL104: torch.nn.utils.clip_grad_norm_ on an FSDP1 model, next to the oracle loop that calls
  the model's own clip_grad_norm_;
- ACL310: guard.Engine loops (W=2) whose prepared scheduler steps twice per optimizer step, sized
  per process (exhausted half-way) or in global batches (right)."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import guard

STEPS, MAX_NORM = 2, 0.05


def _fsdp(use_orig_params: bool = False, **kwargs):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    cpu = torch.device("cpu")
    return FSDP(model, device_id=cpu, use_orig_params=use_orig_params, **kwargs)


def _batches(rank: int):
    generator = torch.Generator().manual_seed(rank)
    return [(torch.randn(4, 8, generator=generator), torch.randn(4, 1, generator=generator))] * (
        STEPS
    )


def _shard_norm(model) -> float:
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.cat(grads)))


def train(rank: int, clip) -> dict:
    model = _fsdp()
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    norms, shard_norms = [], []
    for x, y in _batches(rank):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        shard_norms.append(_shard_norm(model))
        norms.append(float(clip(model)))
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    trained = not all(torch.equal(a, b) for a, b in zip(start, params, strict=True))
    return {"norms": norms, "shard_norms": shard_norms, "params": params, "trained": trained}


def subset(rank: int) -> dict:
    """Part of the parameters of a use_orig_params model: refused before clipping."""
    model = _fsdp(use_orig_params=True)
    x, y = _batches(rank)[0]
    nn.functional.mse_loss(model(x), y).backward()
    first_layer = list(model.parameters())[:2]  # this rank's parts of them (None: not here)
    before = [None if p.grad is None else p.grad.clone() for p in first_layer]
    try:
        torch.nn.utils.clip_grad_norm_(first_layer, MAX_NORM)
        return {"raised": None}
    except guard.GuardError as error:
        same = all(
            (b is None and p.grad is None) or torch.equal(b, p.grad)
            for b, p in zip(before, first_layer, strict=True)
        )
        return {"raised": error.code, "grads_unchanged": same, "message": str(error)}


def no_shard(rank: int) -> dict:
    """NO_SHARD keeps full, all-reduced gradients: torch's clip is right there (and FSDP's own
    clip_grad_norm_ calls it): nothing to report or redirect."""
    from torch.distributed.fsdp import ShardingStrategy

    guard.reset()
    norms = []
    for use_torch in (True, False):
        model = _fsdp(sharding_strategy=ShardingStrategy.NO_SHARD)
        x, y = _batches(rank)[0]
        nn.functional.mse_loss(model(x), y).backward()
        clip = torch.nn.utils.clip_grad_norm_ if use_torch else None
        norm = clip(model.parameters(), MAX_NORM) if clip else model.clip_grad_norm_(MAX_NORM)
        norms.append(float(norm))
    return {"findings": [f.code for f in guard.findings()], "norms": norms}


def engine_schedule(global_batches: bool) -> dict:
    """ACL310 with W=2: a one-cycle schedule sized from the prepared (per-process) loader, or from
    the unprepared one; returns when (at which optimizer step) ACL310 was reported."""
    from torch.utils.data import DataLoader, TensorDataset

    from guard import Engine
    from guard._tracker import TRACKER

    guard.reset()
    n, epochs = 2, 2
    engine = Engine(gradient_accumulation_steps=n)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4)
    global_steps = len(loader) // n * epochs  # the unprepared loader counts global batches
    model, opt, loader = engine.prepare(model, opt, loader)
    total = global_steps if global_batches else len(loader) // n * epochs
    sched = engine.prepare(torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=total))
    reported_at = None
    for _ in range(epochs):
        for x, y in loader:
            with engine.accumulate(model):
                engine.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                sched.step()
                opt.zero_grad()
            if reported_at is None and any(f.code == "ACL310" for f in guard.findings()):
                reported_at = engine.optimizer_steps
    TRACKER.emit("finish")
    found = [(f.code, f.level, f.message) for f in guard.findings() if f.code == "ACL310"]
    return {"findings": found, "reported_at": reported_at, "steps": engine.optimizer_steps}


def worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    guard.reset()
    redirected = train(rank, lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), MAX_NORM))
    found = [(f.code, f.level, f.count, f.message) for f in guard.findings()]
    guard.reset()
    oracle = train(rank, lambda m: m.clip_grad_norm_(MAX_NORM))
    oracle_findings = [f.code for f in guard.findings()]
    same = all(
        torch.equal(a, b) for a, b in zip(redirected["params"], oracle["params"], strict=True)
    )
    result = {
        "rank": rank,
        "findings": found,
        "oracle_findings": oracle_findings,
        "norms": redirected["norms"],
        "oracle_norms": oracle["norms"],
        "shard_norms": oracle["shard_norms"],
        "same_params": same,
        "trained": oracle["trained"],
        "subset": subset(rank),
        "no_shard": no_shard(rank),
        "schedule_per_process": engine_schedule(global_batches=False),
        "schedule_global": engine_schedule(global_batches=True),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    import torch.distributed.fsdp  # noqa: F401  (imported once, inherited by the forked ranks)

    mp.start_processes(worker, (2, _free_port(), sys.argv[1]), nprocs=2, start_method="fork")
