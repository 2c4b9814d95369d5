"""Where the guard's overhead goes: microseconds per micro-step in each check's handler, measured
inside bench/guard_overhead.py's plain loop (MLP width 512, batch 32, N = 4, AdamW, clip at the
step), past its start-up windows.

A handler's cost inside the loop is several times its cost in a microbenchmark: a micro-step's
matrix products leave the caches cold, so what a handler touches comes back from memory. This
times each subscriber where it runs (a `perf_counter` pair around it, ~0.1 us, included), so the
ones worth removing from the per-step path show up by name. The totals are not the overhead
(that is bench/guard_overhead.py's paired figure); the ranking is what this is for.

    python bench/guard_by_check.py [--windows 320] [--width 512] [--batch-size 32] [--top 25]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from engine_overhead import N, make_loader  # bench/ is on sys.path when a bench script runs
from guard_overhead import plain_windows  # the loop whose overhead is measured there

import guard  # noqa: F401  (installs the checks)
from guard._tracker import TRACKER


def timed(name: str, handler, spent: Counter, calls: Counter):
    def run(**payload) -> None:
        start = time.perf_counter()
        handler(**payload)
        spent[name] += time.perf_counter() - start
        calls[name] += 1

    return run


def wrap_subscribers(spent: Counter, calls: Counter) -> None:
    """Every live subscriber (sampled and unsampled lists alike) behind a timer."""
    for table in (TRACKER._subs, TRACKER._unsampled):
        for event, handlers in table.items():
            table[event] = [
                timed(f"{event}: {_name(handler)}", handler, spent, calls) for handler in handlers
            ]


def _name(handler) -> str:
    module = getattr(handler, "__module__", "?").rsplit(".", 1)[-1]
    return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=320)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args()
    torch.set_num_threads(1)
    windows = plain_windows(options.width, make_loader(options.width, 64, options.batch_size))
    for _ in range(40):  # start-up: registration, the first sampled windows
        next(windows)
    spent, calls = Counter(), Counter()
    wrap_subscribers(spent, calls)
    for _ in range(options.windows):
        next(windows)
    micro_steps = options.windows * N
    print(f"{'us/micro-step':>13} {'calls/micro-step':>16}  event: handler")
    for name, seconds in spent.most_common(options.top):
        print(f"{seconds / micro_steps * 1e6:13.2f} {calls[name] / micro_steps:16.3f}  {name}")
    total = sum(spent.values()) / micro_steps * 1e6
    print(f"{total:13.2f} in all handlers per micro-step ({micro_steps} micro-steps)")


if __name__ == "__main__":
    main()
