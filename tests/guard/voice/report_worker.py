"""Two gloo ranks train a DDP model with K=2 accumulation (no_sync off the step, a 1-batch tail
window) with the run report on; each rank writes rank<r>.json with what it recorded itself.

    python report_worker.py RESULTS_DIR
"""

from __future__ import annotations

import json
import os
import socket
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K, BATCHES = 2, 5


def train(rank: int) -> dict:
    from tests.guard.voice import loops

    model = DDP(loops.model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = loops.batches(BATCHES, seed=rank)
    expected: dict = {"micro_batches": [], "grad_norm": [], "lr": [], "tokens": []}
    micro = tokens = 0
    for i, (x, y) in enumerate(data):
        last = (i + 1) % K == 0 or i == len(data) - 1
        with nullcontext() if last else model.no_sync():
            (F.cross_entropy(model(x), y) / K).backward()
        micro += 1
        tokens += int((y != -100).sum())
        if last:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
            for name, value in zip(expected, (micro, norm, 0.1, tokens), strict=True):
                expected[name].append(value)
            opt.step()
            opt.zero_grad()
            micro = tokens = 0
    return expected


def run(rank: int, world: int, port: int, results: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import guard

    guard.install()
    report = os.pathsep.join([str(Path(results) / "run.html"), str(Path(results) / "run.json")])
    guard.configure(report_path=report)
    expected = train(rank)
    with open(Path(results) / f"rank{rank}.json", "w", encoding="utf-8") as fh:
        json.dump({"rank": rank, "expected": expected}, fh)
    dist.destroy_process_group()  # the report is written at exit, after this


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(2, free, sys.argv[1]), nprocs=2)
    sys.exit(0)
