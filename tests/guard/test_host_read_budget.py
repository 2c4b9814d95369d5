"""The guard's host reads per optimizer step (issue 12, "no stalls on a GPU"), counted on CPU as
calls of Tensor.item/tolist/__bool__/__float__/__int__/cpu/numpy in steady state by
bench/host_syncs.py, guard off vs on, in fp32, bf16 and fp16 with a GradScaler.

Budget: one device read per optimizer step (the step's batched read: ACL601's before the step
without a scaler, the tracker's at `GradScaler.update` with one). ACL301 also reads the constant
its window's first loss was divided by (`loss / 4`): torch keeps a Python number as a CPU
tensor whatever the loss's device, so that read never waits for a GPU, and `_graph` refuses to
read a saved operand that lives on a device (pinned here on the meta device)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from guard.checks import _graph

BENCH = Path(__file__).resolve().parents[2] / "bench" / "host_syncs.py"


def _bench():
    spec = importlib.util.spec_from_file_location("host_syncs", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def counts() -> dict:
    return _bench().table("cpu", steps=8, warm_up=9)  # past the guard's sampled first 8 steps


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_at_most_one_device_read_per_step(counts, precision):
    row = counts[precision]
    device_reads = row["added"] - _bench().host_memory_reads(row["sites"]) / 8
    assert device_reads <= 1, row
    assert row["added"] <= 2, row


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_loop_trains_the_same_with_the_guard(precision):
    """Counting changes nothing: the guarded loop's weights equal the unguarded loop's."""
    bench = _bench()
    weights = []
    for guard_on in (False, True):
        bench._install.uninstall()
        if guard_on:
            bench._install.install()
        try:
            loop = bench.make_loop(precision, "cpu", width=16, batch=4)
            for _ in range(3):
                model = next(loop)
            weights.append([p.detach().clone() for p in model.parameters()])
        finally:
            bench._install.uninstall()
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_root_factor_never_reads_the_device():
    x = torch.randn(3, device="meta", requires_grad=True)
    assert _graph.root_factor(x.sum() / 4) == 0.25  # the divisor is a CPU tensor
    assert _graph.root_factor(x.sum() / torch.tensor(4.0, device="meta")) is None  # unknown
