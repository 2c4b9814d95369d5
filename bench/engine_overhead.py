"""Per-micro-step overhead of guard.Engine against a hand-written loop and against Accelerate.

The same MLP and data run through (a) a plain loop, (b) guard.Engine and (c) accelerate's
Accelerator, with 4-step accumulation, in fp32 and bf16. Runs are interleaved round by round
(in a shuffled order) so that machine noise hits all three alike; the script prints the median
time per micro-step and the ratios b/a, c/a and b/c.

    python bench/engine_overhead.py [--width 512] [--rounds 15] [--batches 64] [--threads 1]
        [--clock cpu|wall] [--with-checks]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import guard

N = 4


def make_model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )


def make_loader(width: int, batches: int, batch_size: int) -> DataLoader:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batches * batch_size, width, generator=gen)
    y = torch.randint(0, 10, (batches * batch_size,), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def plain_runner(width: int, loader: DataLoader, precision: str) -> Callable[[], int]:
    """(a) What a careful user writes by hand: autocast forward, loss / N, gated step."""
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    autocast = precision == "bf16"

    def epoch() -> int:
        steps = 0
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = model(x)
            loss = F.cross_entropy(out.float(), y) / N
            loss.backward()
            if (i + 1) % N == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()
            steps += 1
        return steps

    return epoch


def prepared_runner(engine, width: int, loader: DataLoader) -> Callable[[], int]:
    """(b) and (c): the canonical Accelerate-style loop, through `engine`."""
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, loader = engine.prepare(model, opt, loader)

    def epoch() -> int:
        steps = 0
        for x, y in loader:
            with engine.accumulate(model):
                engine.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
            steps += 1
        return steps

    return epoch


def accelerate_runner(width: int, loader: DataLoader, precision: str) -> Callable[[], int]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=N)
    return prepared_runner(accelerator, width, loader)


def measure(
    runners: dict[str, Callable[[], int]], rounds: int, clock: Callable[[], float]
) -> dict[str, float]:
    """Median seconds per micro-step for each runner, interleaved in shuffled order."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():  # warm-up: allocator, autocast caches, first-call paths
        run()
    order = list(runners)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            start = clock()
            steps = runners[name]()
            samples[name].append((clock() - start) / steps)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: process CPU time (robust on a shared machine); wall: perf_counter",
    )
    parser.add_argument(
        "--with-checks", action="store_true", help="keep the guard's runtime checks installed"
    )
    args = parser.parse_args()
    if not args.with_checks:
        guard.uninstall()  # measure the engine itself; the checks cost all three loops alike
    torch.set_num_threads(args.threads)  # one thread: stable timings on a shared machine
    random.seed(0)
    loader = make_loader(args.width, args.batches, args.batch_size)
    print(
        f"MLP width {args.width}, batch {args.batch_size}, N={N}, {args.batches} micro-steps "
        f"per epoch, {args.rounds} rounds, torch threads {torch.get_num_threads()}, "
        f"guard checks {'on' if args.with_checks else 'off'}, {args.clock} clock"
    )
    print(f"{'precision':<10}{'plain ms':>10}{'engine ms':>11}{'accel ms':>10}", end="")
    print(f"{'b/a':>8}{'c/a':>8}{'b/c':>8}")
    for precision in ("no", "bf16"):
        runners = {
            "plain": plain_runner(args.width, loader, precision),
            "engine": prepared_runner(
                guard.Engine(precision, gradient_accumulation_steps=N, device="cpu"),
                args.width,
                loader,
            ),
            "accelerate": accelerate_runner(args.width, loader, precision),
        }
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        t = measure(runners, args.rounds, clock)
        a, b, c = t["plain"], t["engine"], t["accelerate"]
        label = "fp32" if precision == "no" else precision
        print(f"{label:<10}{a * 1e3:>10.3f}{b * 1e3:>11.3f}{c * 1e3:>10.3f}", end="")
        print(f"{b / a:>8.3f}{c / a:>8.3f}{b / c:>8.3f}")


if __name__ == "__main__":
    main()
