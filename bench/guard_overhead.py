"""Cost of the guard's runtime checks: a plain loop without and with them, and guard.Engine.

Three variants train an MLP (width 512 by default, CPU, fp32, 4-step accumulation with loss / 4,
gradient clipping at the step, AdamW, batches from a DataLoader):

    plain         a hand-written loop, the guard uninstalled (torch exactly as without it)
    plain+guard   the same loop, the same model, optimizer and batches, the checks installed
                  (as by `import guard`; nothing fires)
    plain+report  plain+guard with the run report on (ACCEL_GUARD_REPORT=run.json: the
                  per-window series recorded), column r/a
    engine+guard  guard.Engine with the checks installed

The target figure is a run's steady state, what a user pays per micro-step over thousands of
steps. The guard's start-up, paid once per run, is reported apart: in its first two windows it
registers the optimizer and its hooks, and ACL301 has no window length k to judge by yet, so it
keeps every pass's factor and a probe gradient norm (100-200 us per micro-step more at width
512, some milliseconds in all).

The design is bench/engine_overhead.py's (its helpers are imported): rounds run one window of
N micro-steps of each variant in a shuffled order, time is CPU time with one torch thread,
glibc keeps freed memory, and the overhead in microseconds is the median of the per-round
differences with its interquartile range. What differs:

- the ratios are medians of the per-round ratios (paired, like the differences), not ratios
  of the medians, which moved by about 0.01 between runs with the same overhead;
- the checks are process-wide, so plain and plain+guard are one loop in this process, the
  guard installed or uninstalled between blocks of windows. Sharing the tensors matters: two
  processes (or two models) that differ only in where their memory landed differ by about 1%
  on a loaded 2-core machine, as much as the effect measured;
- `uninstall()` drops all the guard knows, so each block starts the guard afresh: a block is
  `STARTUP_WINDOWS` windows timed as the start-up sample, `SETTLE_WINDOWS` untimed windows (the
  guard's first 8 steps, where ACL308 measures every window; later, every 16th), then `--block`
  windows whose mean is the steady-state sample: the guard's steps 10 to 25, one of them
  sampled by ACL308, as in a long run. (Toggling the guard around single windows timed only its
  second step, and measured start-up as overhead: about 210 against 60 us per micro-step.);
- engine+guard runs in worker processes, installed throughout (uninstalling would drop what
  the engine told the guard at `prepare`), taken in turn: one worker's e/a moved by 0.05
  between runs with its memory placement, several average that out;
- each steady-state sample follows windows of the same variant, so every variant is timed with
  its own tensors in the caches, as in a run that trains one loop. Without that, a window that
  follows another variant's starts cold (the engine's worker measured ~10% slower). The
  engine's workers run one or two untimed windows (alternately) before each timed one, so the
  timed windows fall on every step number, the sampled ones included.

Target (issue 12): plain+guard / plain <= 1.03 at width 512, batch 32 and 64.

    python bench/guard_overhead.py [--width 512] [--rounds 150] [--block 16] [--batches 64]
        [--batch-size 32 64] [--threads 1] [--engine-workers 4] [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import random
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.nn.functional as F
from _mlp import make_model  # bench/ is on sys.path when a bench script runs
from engine_overhead import (
    WARM_UP_WINDOWS,
    N,
    keep_freed_memory,
    make_loader,
    measure,
    paired_us,
    window_timer,
)
from torch.utils.data import DataLoader

import guard
from guard import _report

VARIANTS = ("plain", "plain+guard", "engine+guard", "plain+report")
STARTUP_WINDOWS = 2  # the guard's first windows after install: start-up, timed apart
SETTLE_WINDOWS = 8  # then untimed, so the steady sample starts past ACL308's 8 measured steps
TARGET = 1.03


def plain_windows(width: int, loader: DataLoader) -> Iterator[None]:
    """A careful hand-written loop: loss / N, clip and step every N micro-steps."""
    model = make_model(width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    while True:
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x), y) / N
            loss.backward()
            if (i + 1) % N == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
                yield


def engine_windows(width: int, loader: DataLoader) -> Iterator[None]:
    """The same training through guard.Engine's Accelerate-style loop."""
    engine = guard.Engine(gradient_accumulation_steps=N, device="cpu")
    model = make_model(width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = engine.prepare(model, optimizer, loader)
    while True:
        for i, (x, y) in enumerate(loader):
            with engine.accumulate(model):
                engine.backward(F.cross_entropy(model(x), y))
                if engine.sync_gradients:
                    engine.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
            if (i + 1) % N == 0:
                yield


def engine_worker(args: argparse.Namespace, conn: Connection) -> None:
    """Run engine+guard windows on request: receives True (run two) or False (stop).

    Answers each request with the seconds of the second window; at the stop, with the guard's
    findings (empty when nothing fired). Any exception goes back as its traceback text.
    """
    try:
        guard.configure(mode="raise")  # nothing may fire: a finding stops the benchmark
        torch.set_num_threads(args.threads)
        loader = make_loader(args.width, args.batches, args.batch_size)
        run = window_timer(engine_windows(args.width, loader), clock_of(args))
        for _ in range(WARM_UP_WINDOWS):
            run()
        gc.collect()
        gc.freeze()  # later full collections skip the long-lived objects
        requests = 0
        while conn.recv():
            requests += 1
            for _ in range(1 + requests % 2):  # untimed: the timed window starts warm
                run()
            conn.send(run())
        conn.send(findings_text())
    except BaseException:
        conn.send(traceback.format_exc())
    finally:
        conn.close()


def findings_text() -> str:
    """The guard's summary when it reported anything in this process, else ""."""
    return guard.summary_text() if guard.findings() else ""


def clock_of(args: argparse.Namespace) -> Callable[[], float]:
    return time.process_time if args.clock == "cpu" else time.perf_counter


class Remote:
    """A `measure` runner backed by the engine's worker process: each call runs one window."""

    def __init__(self, args: argparse.Namespace) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter
        self.conn, child = context.Pipe()
        self.process = context.Process(target=engine_worker, args=(args, child), daemon=True)
        self.process.start()
        child.close()

    def __call__(self) -> float:
        self.conn.send(True)
        return self._answer()

    def stop(self) -> str:
        """Ends the worker; returns the guard's findings text (empty when nothing fired)."""
        if not self.process.is_alive():
            return ""  # it failed, and its traceback was raised already
        self.conn.send(False)
        findings = self._answer()
        self.process.join()
        return findings

    def _answer(self) -> Any:
        answer = self.conn.recv()
        if isinstance(answer, str) and answer.startswith("Traceback"):
            raise RuntimeError(f"the engine worker failed:\n{answer}")
        return answer


class Workers:
    """A `measure` runner that takes the engine's workers in turn: each process's memory
    placement shifts its times by a few percent, so several average that out."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.remotes = [Remote(args) for _ in range(args.engine_workers)]
        self.turn = 0

    def __call__(self) -> float:
        self.turn += 1
        return self.remotes[self.turn % len(self.remotes)]()

    def stop(self) -> str:
        """Ends every worker; returns their findings text (empty when nothing fired)."""
        return "".join(remote.stop() for remote in self.remotes)


class Toggled:
    """A `measure` runner for the shared plain loop: the guard installed or uninstalled, then a
    block of windows. Returns the mean seconds of the block's steady windows; keeps the mean
    of its first `STARTUP_WINDOWS` in `startup`."""

    def __init__(
        self, timer: Callable[[], float], checks: bool, block: int, report: str = ""
    ) -> None:
        self.timer, self.checks, self.block = timer, checks, block
        self.report = report  # the run report's path while this runner's blocks run
        self.startup: list[float] = []

    def __call__(self) -> float:
        if self.checks and _report.report_path() != (self.report or None):
            guard.uninstall()  # the report's recorder is subscribed (or not) at install
        guard.configure(report_path=self.report)
        if self.checks:
            guard.install()
        else:
            guard.uninstall()
        self.startup.append(self._mean(STARTUP_WINDOWS))
        for _ in range(SETTLE_WINDOWS):
            self.timer()
        return self._mean(self.block)

    def _mean(self, windows: int) -> float:
        return sum(self.timer() for _ in range(windows)) / windows


def paired_ratio(extra: list[float], base: list[float]) -> float:
    """Median of the per-round ratios: steadier than a ratio of medians, whose two medians
    come from different rounds."""
    return statistics.median(e / b for e, b in zip(extra, base, strict=True))


def report(samples: dict[str, list[float]], startup: tuple[list[float], list[float]]) -> None:
    a, g, e, _ = (statistics.median(samples[name]) for name in VARIANTS)
    ga, ea, ra = (paired_ratio(samples[name], samples["plain"]) for name in VARIANTS[1:])
    (ga_us, ga_iqr), (ea_us, ea_iqr), (ra_us, ra_iqr) = (
        paired_us(samples[name], samples["plain"]) for name in VARIANTS[1:]
    )
    print(f"{'plain ms':>9}{'guard ms':>10}{'engine ms':>10}{'g/a':>7}{'e/a':>7}", end="")
    print(f"{'g-a us':>9}{'':<8}{'e-a us':>8}")
    print(f"{a * 1e3:>9.3f}{g * 1e3:>10.3f}{e * 1e3:>10.3f}{ga:>7.3f}{ea:>7.3f}", end="")
    print(f"{ga_us:>9.1f} ±{ga_iqr:<6.1f}{ea_us:>8.1f} ±{ea_iqr:<6.1f}")
    print(f"run report on: r/a = {ra:.3f}, r-a = {ra_us:.1f} ±{ra_iqr:.1f} us per micro-step")
    verdict = "met" if ga <= TARGET else "NOT met"
    print(f"target: g/a = plain+guard / plain <= {TARGET} ({verdict})")
    plain, guarded = (values[-len(samples["plain"]) :] for values in startup)  # past warm-up
    start_us, start_iqr = paired_us([g / N for g in guarded], [a / N for a in plain])
    print(
        f"start-up, the guard's first {STARTUP_WINDOWS} windows after install (once per run): "
        f"{start_us:+.1f} ±{start_iqr:.1f} us per micro-step"
    )


def main() -> None:
    keep_freed_memory()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=150, help="samples per variant")
    parser.add_argument("--block", type=int, default=16, help="steady windows per plain sample")
    parser.add_argument("--batches", type=int, default=64, help="micro-steps per epoch")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[32, 64], help="one run each")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--engine-workers", type=int, default=4, help="processes, taken in turn")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: process CPU time (robust on a shared machine); wall: perf_counter",
    )
    args = parser.parse_args()
    if args.batches % N:
        parser.error(f"--batches must be a multiple of N={N} (windows end with the epoch)")
    for batch_size in args.batch_size:
        random.seed(0)
        run_one(argparse.Namespace(**{**vars(args), "batch_size": batch_size}))


def run_one(args: argparse.Namespace) -> None:
    """One measurement at one batch size, printed."""
    print(
        f"MLP width {args.width}, batch {args.batch_size}, N={N}, fp32, AdamW, clip at the "
        f"step, {args.batches} micro-steps per epoch, {args.rounds} rounds of {args.block} steady "
        f"windows (plain loops) or 1 window (engine), "
        f"torch threads {args.threads}, {args.engine_workers} engine workers, {args.clock} clock, "
        f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}"
    )
    print("medians per micro-step; ratios and overheads: medians of the per-round ratios and")
    print("differences (each round times one sample of each variant), the latter ± IQR")
    engine = Workers(args)
    guard.configure(mode="raise")  # nothing may fire: a finding stops the benchmark
    torch.set_num_threads(args.threads)
    loader = make_loader(args.width, args.batches, args.batch_size)
    timer = window_timer(plain_windows(args.width, loader), clock_of(args))
    report_dir = tempfile.mkdtemp(prefix="guard-overhead-")
    runners = {
        "plain": Toggled(timer, False, args.block),
        "plain+guard": Toggled(timer, True, args.block),
        "plain+report": Toggled(timer, True, args.block, os.path.join(report_dir, "run.json")),
    }
    try:
        samples = measure({**runners, "engine+guard": engine}, args.rounds)
    finally:
        fired = {"engine+guard": engine.stop()}
    guard.configure(report_path="")  # the report's series are not wanted at exit
    guard.install()
    fired["plain+guard"] = findings_text()
    for name, text in fired.items():
        if text:
            raise SystemExit(f"the guard reported findings in {name}, figures void:\n{text}")
    report(samples, (runners["plain"].startup, runners["plain+guard"].startup))
    print()


if __name__ == "__main__":
    main()
