"""Two gloo processes on CPU for the ACL104 FSDP1 test: run as a script; each rank writes a JSON
file with what the guard (raise mode) did to torch.nn.utils.clip_grad_norm_ on an FSDP1 model,
next to the oracle loop that calls the model's own clip_grad_norm_."""

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

STEPS, MAX_NORM = 3, 0.05


def _fsdp(use_orig_params: bool = False):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return FSDP(model, device_id=torch.device("cpu"), use_orig_params=use_orig_params)


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
