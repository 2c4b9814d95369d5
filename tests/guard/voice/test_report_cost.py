"""The run report's recording costs no host read of its own: with it on, the guard still reads
the device at most once per optimizer step (the budget of tests/guard/test_host_read_budget.py,
counted by bench/host_syncs.py in fp32, bf16 and fp16)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from guard import _report
from guard.run_report import recorder

BENCH = Path(__file__).resolve().parents[3] / "bench" / "host_syncs.py"
STEPS, WARM_UP = 8, 9


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("host_syncs", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reads_per_step(bench, precision: str, guard_on: bool) -> tuple[float, dict]:
    """bench.reads_per_step on the benches' loop at width 16 (the reads do not depend on it)."""
    bench._install.uninstall()
    if guard_on:
        bench._install.install()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 16-wide model: more threads only spin
    try:
        loop = bench.make_loop(precision, "cpu", width=16, batch=4)
        with bench.HostReads() as reads:
            for _ in range(WARM_UP):
                next(loop)
            reads.reset()
            for _ in range(STEPS):
                next(loop)
        return reads.total / STEPS, reads.sites
    finally:
        torch.set_num_threads(threads)
        bench._install.uninstall()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_one_device_read_per_step_with_the_report_on(bench, precision, tmp_path):
    saved = _report._state.settings
    try:
        off, _ = _reads_per_step(bench, precision, False)
        _report._state.settings = _report._Settings(report_path=str(tmp_path / "run.json"))
        on, sites = _reads_per_step(bench, precision, True)
    finally:
        _report._state.settings = saved
    device_reads = on - off - bench.host_memory_reads(sites) / STEPS
    assert device_reads <= 1 and on - off <= 2, (precision, on, off, sites)
    (series,) = recorder.recording().series  # it did record: every window, its norm read
    assert series.windows == STEPS + WARM_UP
    assert all(row.grad_norm is not None for row in series.rows[:-1])  # the last one: at exit
