"""Host reads per optimizer step of a correct loop, the guard's checks off and on, per precision.

A host read is a call of `Tensor.item/tolist/__bool__/__float__/__int__/cpu/numpy`: on a GPU
each one waits for the device queue to drain (a device-to-host sync). The loop is the one the
overhead benches time (MLP of width 512, batch 32, N = 4 micro-steps with loss / N, clip at
the step, AdamW), in fp32, bf16 autocast, and fp16 autocast with a GradScaler (unscale_, clip,
step, update). Reads are counted in steady state (after `--warm-up` steps) and attributed to the
guard when a frame of the `guard` package is on the stack, else to the loop (torch included:
the scaler's own found-inf read, AdamW's step counters on CPU).

Target (issue 12): at most 1 read per optimizer step added by the guard, in every precision.
The "device" column leaves out ACL301's read of the number a loss was divided by (a CPU tensor
on any device, see HOST_MEMORY_SITES).
On CUDA the script also runs the guard-on loop under `torch.cuda.set_sync_debug_mode("warn")`,
which reports every synchronizing call, the ones made inside C++ included.

    python bench/host_syncs.py [--device cpu|cuda] [--steps 8] [--warm-up 9]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections import Counter
from collections.abc import Iterator

import torch
import torch.nn.functional as F

import guard
from guard import _install

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")
PRECISIONS = ("fp32", "bf16", "fp16")
N = 4
_GUARD_DIR = os.path.dirname(os.path.abspath(guard.__file__)) + os.sep


class HostReads:
    """Counts host reads while active, and where the guard's own code made them (`sites`:
    file:line of a read called directly from the `guard` package)."""

    def __init__(self) -> None:
        self.total = 0
        self.sites: Counter = Counter()
        self._saved: dict[str, object] = {}

    def __enter__(self) -> HostReads:
        for name in READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._counting(original))
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)

    def reset(self) -> None:
        self.total = 0
        self.sites.clear()

    def _counting(self, original):
        counts = self

        def read(tensor, *args, **kwargs):
            counts.total += 1
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(_GUARD_DIR):
                where = caller.f_code.co_filename[len(_GUARD_DIR) :]
                counts.sites[f"{where}:{caller.f_lineno}"] += 1
            return original(tensor, *args, **kwargs)

        return read


# ACL301 reads the Python number a loss was divided by (`loss / 4`), which torch keeps as a CPU
# tensor whatever the loss's device: a read of host memory that never waits for a GPU.
HOST_MEMORY_SITES = ("checks/_graph.py",)


def host_memory_reads(sites: Counter) -> int:
    return sum(n for site, n in sites.items() if site.startswith(HOST_MEMORY_SITES))


def make_loop(
    precision: str, device: str, width: int = 512, batch: int = 32
) -> Iterator[torch.nn.Module]:
    """One optimizer step of the benches' correct loop per `next()`, which returns the model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fp16 = precision == "fp16"
    scaler = torch.amp.GradScaler(device, enabled=fp16)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    while True:
        for _ in range(N):
            with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), y) / N
            scaler.scale(loss).backward()
        if fp16:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        yield model


def reads_per_step(
    precision: str, guard_on: bool, device: str, steps: int, warm_up: int
) -> tuple[float, Counter]:
    """All host reads per optimizer step in steady state, and the guard's read sites."""
    _install.uninstall()
    if guard_on:
        _install.install()
    try:
        loop = make_loop(precision, device)
        with HostReads() as reads:
            for _ in range(warm_up):
                next(loop)
            reads.reset()
            for _ in range(steps):
                next(loop)
        return reads.total / steps, reads.sites
    finally:
        _install.uninstall()


def table(device: str = "cpu", steps: int = 8, warm_up: int = 9) -> dict[str, dict]:
    """precision -> {"off", "on": reads per step, "added": on - off, "sites": the guard's}."""
    rows = {}
    for precision in PRECISIONS:
        off, _ = reads_per_step(precision, False, device, steps, warm_up)
        on, sites = reads_per_step(precision, True, device, steps, warm_up)
        rows[precision] = {"off": off, "on": on, "added": on - off, "sites": sites}
    return rows


@contextlib.contextmanager
def _sync_debug_warnings() -> Iterator[list]:
    """CUDA's own record of every synchronizing call (C++ ones included)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def cuda_syncs(precision: str, guard_on: bool, steps: int, warm_up: int) -> float:
    """Synchronizing calls per optimizer step that CUDA's sync debug mode reports."""
    _install.uninstall()
    if guard_on:
        _install.install()
    try:
        loop = make_loop(precision, "cuda")
        for _ in range(warm_up):
            next(loop)
        with _sync_debug_warnings() as caught:
            for _ in range(steps):
                next(loop)
        return sum("synchroniz" in str(w.message) for w in caught) / steps
    finally:
        _install.uninstall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warm-up", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    guard.configure(mode="warn")
    print(f"host reads per optimizer step on {args.device} (N = {N}, steady state)")
    print(f"{'precision':<10}{'guard off':>10}{'guard on':>10}{'added':>8}{'device':>8}")
    worst = 0.0
    for precision, row in table(args.device, args.steps, args.warm_up).items():
        device = row["added"] - host_memory_reads(row["sites"]) / args.steps
        worst = max(worst, device)
        print(
            f"{precision:<10}{row['off']:>10.2f}{row['on']:>10.2f}{row['added']:>8.2f}"
            f"{device:>8.2f}"
        )
        for site, count in row["sites"].most_common():
            print(f"    guard/{site}: {count / args.steps:.2f} per step")
    if args.device == "cuda":
        print("CUDA sync debug mode, synchronizing calls per step (guard off / on):")
        for precision in PRECISIONS:
            off = cuda_syncs(precision, False, args.steps, args.warm_up)
            on = cuda_syncs(precision, True, args.steps, args.warm_up)
            print(f"  {precision:<8}{off:>6.2f} / {on:.2f}")
    print(f"target: at most 1 added device read per step: {'met' if worst <= 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
