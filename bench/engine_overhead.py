"""Per-micro-step overhead of guard.Engine against a hand-written loop and against Accelerate.

The same MLP and data run through (a) a plain loop, (b) guard.Engine and (c) accelerate's
Accelerator, with 4-step accumulation, in fp32 and bf16. Why the numbers hold still on a small,
shared machine:

- the three variants are generators that train epoch after epoch and pause after each window
  of N micro-steps; a round runs one window of each, in a shuffled order, so the samples being
  compared lie milliseconds apart and machine noise and drift hit all of them alike;
- time is this process's CPU time with torch's intra-op threads fixed (other load on the
  machine does not count); the set-up objects are frozen out of the garbage collector;
- glibc's malloc is told to keep freed memory (the script re-executes itself with
  `MALLOC_*` settings unless they are set): otherwise each window's large tensors are mapped
  and unmapped again, and hundreds of page faults per window, varying with heap layout rather
  than with the code under test, add up to a millisecond of system time;
- besides the ratios of the medians, the overhead in microseconds per micro-step is the median
  of the per-round differences b - a and c - a (paired within a round), with its interquartile
  range: the absolute figure is steadier than a ratio whose denominator moves with the model.

Targets (issue): b/a <= 1.05 at width 512, and b/c < 1. `--width 8` makes Python overhead
dominate and shows the engine's own cost.

    python bench/engine_overhead.py [--width 512] [--rounds 800] [--batches 64] [--threads 1]
        [--clock cpu|wall] [--with-checks]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from _mlp import make_model  # bench/ is on sys.path when a bench script runs
from torch.utils.data import DataLoader, TensorDataset

import guard

N = 4
VARIANTS = ("plain", "engine", "accelerate")
WARM_UP_WINDOWS = 8


def make_loader(width: int, batches: int, batch_size: int) -> DataLoader:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batches * batch_size, width, generator=gen)
    y = torch.randint(0, 10, (batches * batch_size,), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def plain_windows(width: int, loader: DataLoader, precision: str) -> Iterator[None]:
    """(a) What a careful user writes by hand: autocast forward (bf16 only), loss / N, gated step.

    Like the others it trains epoch after epoch and pauses after every window of N micro-steps.
    """
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if precision != "bf16":
            return model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float()

    while True:
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(forward(x), y) / N
            loss.backward()
            if (i + 1) % N == 0:
                opt.step()
                opt.zero_grad()
                yield


def prepared_windows(engine: Any, width: int, loader: DataLoader) -> Iterator[None]:
    """(b) and (c): the canonical Accelerate-style loop, through `engine`."""
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, loader = engine.prepare(model, opt, loader)
    while True:
        for i, (x, y) in enumerate(loader):
            with engine.accumulate(model):
                engine.backward(F.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
            if (i + 1) % N == 0:
                yield


def accelerate_windows(width: int, loader: DataLoader, precision: str) -> Iterator[None]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=N)
    return prepared_windows(accelerator, width, loader)


def window_timer(windows: Iterator[None], clock: Callable[[], float]) -> Callable[[], float]:
    """A runner for `measure`: runs the next window of `windows`, returns its seconds."""

    def run() -> float:
        start = clock()
        next(windows)
        return clock() - start

    return run


def measure(runners: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Seconds per micro-step of each runner, one window each per round in a shuffled order.

    A runner runs one window of N micro-steps and returns the seconds it took.
    """
    samples: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for _ in range(WARM_UP_WINDOWS):  # allocator, autocast caches, first-call paths
        for runner in runners.values():
            runner()
    gc.collect()
    gc.freeze()  # later full collections skip the long-lived objects: short, rare pauses
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            samples[name].append(runners[name]() / N)
    return samples


def paired_us(extra: list[float], base: list[float]) -> tuple[float, float]:
    """Median and interquartile range, in microseconds, of the per-round differences."""
    diffs = [(e - b) * 1e6 for e, b in zip(extra, base, strict=True)]
    q1, _, q3 = statistics.quantiles(diffs, n=4)
    return statistics.median(diffs), q3 - q1


def report(label: str, samples: dict[str, list[float]]) -> None:
    a, b, c = (statistics.median(samples[name]) for name in VARIANTS)
    (ba_us, ba_iqr), (ca_us, ca_iqr) = (
        paired_us(samples[name], samples["plain"]) for name in ("engine", "accelerate")
    )
    print(f"{label:<6}{a * 1e3:>9.3f}{b * 1e3:>10.3f}{c * 1e3:>9.3f}", end="")
    print(f"{b / a:>7.3f}{c / a:>7.3f}{b / c:>7.3f}", end="")
    print(f"{ba_us:>9.1f} ±{ba_iqr:<6.1f}{ca_us:>8.1f} ±{ca_iqr:<6.1f}")


MALLOC_SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),  # large tensors come from the heap, not mmap
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),  # freed heap memory is kept for the next window
    "MALLOC_TOP_PAD_": str(64 << 20),
}


def keep_freed_memory() -> None:
    """Re-execute this script once with MALLOC_SETTINGS (glibc reads them only at start-up)."""
    if any(name in os.environ for name in MALLOC_SETTINGS):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_SETTINGS})


def main() -> None:
    keep_freed_memory()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=800, help="windows per variant")
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
    if args.batches % N:
        parser.error(f"--batches must be a multiple of N={N} (windows end with the epoch)")
    if not args.with_checks:
        guard.uninstall()  # measure the engine itself; the checks cost all three loops alike
    torch.set_num_threads(args.threads)  # fixed: thread start-up and migration are noise
    random.seed(0)
    loader = make_loader(args.width, args.batches, args.batch_size)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(
        f"MLP width {args.width}, batch {args.batch_size}, N={N}, {args.batches} micro-steps "
        f"per epoch, {args.rounds} rounds of one window each, "
        f"torch threads {torch.get_num_threads()}, "
        f"guard checks {'on' if args.with_checks else 'off'}, {args.clock} clock, "
        f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}"
    )
    print("medians per micro-step; overhead = median of per-round differences ± IQR")
    print(f"{'':<6}{'plain ms':>9}{'engine ms':>10}{'accel ms':>9}", end="")
    print(f"{'b/a':>7}{'c/a':>7}{'b/c':>7}{'b-a us':>9}{'':<8}{'c-a us':>8}")
    for precision in ("no", "bf16"):
        engine = guard.Engine(precision, gradient_accumulation_steps=N, device="cpu")
        runners = {
            "plain": plain_windows(args.width, loader, precision),
            "engine": prepared_windows(engine, args.width, loader),
            "accelerate": accelerate_windows(args.width, loader, precision),
        }
        timers = {name: window_timer(windows, clock) for name, windows in runners.items()}
        report("fp32" if precision == "no" else precision, measure(timers, args.rounds))


if __name__ == "__main__":
    main()
