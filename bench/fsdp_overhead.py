"""Per-micro-step overhead of guard.Engine(fsdp_plugin=...) against a hand-written FSDP2 loop, on
2 gloo processes on CPU.

Both variants train the same MLP (its hidden layers in an `nn.ModuleList`, so both shard the
same FSDP2 units: each block, then the root) with N-step accumulation:

- (a) by hand: `fully_shard` per block and the root, `set_requires_gradient_sync(last)`,
  `(loss / N).backward()`, step and zero_grad on the last micro-step;
- (b) the engine: `engine.prepare`, `with engine.accumulate(model)`, `engine.backward(loss)`.

Each variant is a generator that pauses after every window of N micro-steps; a round runs one
window of each in an order drawn from a seed both ranks share (their collectives must pair up),
so the compared samples lie milliseconds apart and machine drift hits both alike. Time is this
process's CPU time (`--clock cpu`, the default: other load on the shared machine does not
count) or wall time. Reported by rank 0: the median per-round difference b - a per micro-step
with its interquartile range, and the ratio of the medians. The guard is off unless
`--with-checks` (then both variants run under every runtime check).

    python bench/fsdp_overhead.py [--width 256] [--rounds 200] [--clock cpu|wall] [--with-checks]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import sys
import time
from collections.abc import Iterator

N, BATCH, BLOCKS, WORLD = 4, 16, 2, 2
WARM_UP = 5


def make_model(width: int):
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(width, width)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(BLOCKS))
            self.out = torch.nn.Linear(width, 10)

        def forward(self, x):
            h = torch.relu(self.inp(x))
            for block in self.blocks:
                h = torch.relu(block(h))
            return self.out(h)

    torch.manual_seed(0)
    return Net()


def make_data(width: int, batches: int):
    import torch

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batches * BATCH, width, generator=gen)
    return x, torch.randint(0, 10, (batches * BATCH,), generator=gen)


def by_hand(width: int, batches: int, rank: int) -> Iterator[None]:
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    model = make_model(width)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = make_data(width, batches)
    mine = [
        (x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(batches)
    ]
    mine = mine[rank::WORLD]
    while True:
        for i, (xb, yb) in enumerate(mine):
            last = (i + 1) % N == 0
            model.set_requires_gradient_sync(last)
            (F.cross_entropy(model(xb), yb) / N).backward()
            if last:
                opt.step()
                opt.zero_grad()
                yield


def through_engine(width: int, batches: int) -> Iterator[None]:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    import guard

    engine = guard.Engine("no", gradient_accumulation_steps=N, fsdp_plugin=True)
    model = make_model(width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = make_data(width, batches)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    model, opt, loader = engine.prepare(model, opt, loader)
    while True:
        for xb, yb in loader:
            with engine.accumulate(model):
                engine.backward(F.cross_entropy(model(xb), yb))
                opt.step()
                opt.zero_grad()
            if engine.sync_gradients:
                yield


def run(rank: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ["ACCEL_GUARD"] = "warn" if args.with_checks else "off"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    batches = WORLD * N * 8  # 8 windows per epoch on each rank
    variants = {
        "hand": by_hand(args.width, batches, rank),
        "engine": through_engine(args.width, batches),
    }
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    order = random.Random(0)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(WARM_UP + args.rounds):
        names = list(variants)
        order.shuffle(names)
        for name in names:
            start = clock()
            next(variants[name])
            if round_ >= WARM_UP:
                times[name].append((clock() - start) / N)
    if rank == 0:
        report(times, args)
    dist.destroy_process_group()


def report(times: dict[str, list[float]], args: argparse.Namespace) -> None:
    diffs = [(b - a) * 1e6 for a, b in zip(times["hand"], times["engine"], strict=True)]
    q1, median, q3 = statistics.quantiles(diffs, n=4)
    hand, engine = statistics.median(times["hand"]), statistics.median(times["engine"])
    checks = "guard checks on" if args.with_checks else "guard off"
    print(f"FSDP2, 2 gloo ranks, width {args.width}, N={N}, {args.clock} clock, {checks}")
    print(f"  hand-written: {hand * 1e6:8.1f} us per micro-step (median)")
    print(f"  engine:       {engine * 1e6:8.1f} us per micro-step (median)")
    print(f"  engine - hand: {median:+.1f} us per micro-step (IQR {q1:+.1f} .. {q3:+.1f})")
    print(f"  engine / hand: {engine / hand:.3f}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--with-checks", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torch.multiprocessing as mp

    mp.spawn(run, args=(free_port(), args), nprocs=WORLD)


if __name__ == "__main__":
    main()
