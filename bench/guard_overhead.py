"""Cost of the guard's runtime checks, measured in one run.

Three variants train the same MLP (width 512 by default, CPU, fp32, 4-step accumulation with
loss / 4, gradient clipping at the step, AdamW):

    plain         a hand-written loop, guard not installed
    plain+guard   the same loop with the checks installed (`import guard`; nothing fires)
    engine+guard  guard.Engine with the checks installed

Rounds are interleaved in a shuffled order so machine noise hits all variants alike, and time is
this process's CPU time (so other load on a shared machine does not count); the script prints
the median time per micro-step and the ratios. Target: plain+guard <= 1.05x plain.

    python bench/guard_overhead.py [--width 512] [--rounds 15] [--micro-steps 64] [--threads N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _mlp import make_model  # bench/ is on sys.path when a bench script runs

import guard

N = 4


def make_batches(width: int, count: int, batch_size: int) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(batch_size, width, generator=gen),
            torch.randint(0, 10, (batch_size,), generator=gen),
        )
        for _ in range(count)
    ]


def plain_loop(width: int, batches: list) -> Callable[[], None]:
    model = make_model(width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def run() -> None:
        for i, (x, y) in enumerate(batches):
            loss = F.cross_entropy(model(x), y) / N
            loss.backward()
            if (i + 1) % N == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()

    return run


def engine_loop(width: int, batches: list) -> Callable[[], None]:
    engine = guard.Engine(gradient_accumulation_steps=N, device="cpu")
    model = make_model(width)
    model, optimizer = engine.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def run() -> None:
        for x, y in batches:
            with engine.accumulate(model):
                engine.backward(F.cross_entropy(model(x), y))
                if engine.sync_gradients:
                    engine.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()

    return run


def timed(run: Callable[[], None], micro_steps: int) -> float:
    """Milliseconds of CPU time per micro-step."""
    start = time.process_time()
    run()
    return (time.process_time() - start) / micro_steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--micro-steps", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    guard.configure(mode="raise")  # any finding would stop the benchmark: nothing may fire

    batches = make_batches(args.width, args.micro_steps, args.batch_size)
    guard.uninstall()
    plain = plain_loop(args.width, batches)
    guard.install()
    guarded, engine = plain_loop(args.width, batches), engine_loop(args.width, batches)
    variants = {
        "plain": (False, plain),
        "plain+guard": (True, guarded),
        "engine+guard": (True, engine),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for checks, run in variants.values():  # warm-up
        (guard.install if checks else guard.uninstall)()
        run()
    order = list(variants)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            checks, run = variants[name]
            (guard.install if checks else guard.uninstall)()
            times[name].append(timed(run, args.micro_steps))
    guard.install()
    assert not guard.findings(), guard.summary_text()

    median = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"MLP width {args.width}, batch {args.batch_size}, {N}-step accumulation, "
        f"{torch.get_num_threads()} threads, {args.rounds} rounds x {args.micro_steps} micro-steps"
    )
    for name, value in median.items():
        print(f"  {name:<13} {value:8.3f} ms CPU per micro-step (median)")
    print(
        f"  plain+guard / plain  = {median['plain+guard'] / median['plain']:.3f}  (target <= 1.05)"
    )
    print(f"  engine+guard / plain = {median['engine+guard'] / median['plain']:.3f}")


if __name__ == "__main__":
    main()
