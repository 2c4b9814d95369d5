"""Fixtures for the engine tests: devices, Accelerate's singleton reset, and the DDP worker pool.

The pool starts one 2-process gloo group per test session (only when a DDP test asks for it);
each DDP test sends an importable function to both ranks and gets both results back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # engine_reference and ddp_cases are shared with the workers
sys.path.insert(0, str(HERE.parent))  # tests/guard, for the worker pool
from worker_pool import WorkerPool  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_accelerate_state():
    """Accelerate keeps process-wide singletons; every test starts from a clean slate."""
    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


@pytest.fixture(scope="session")
def ddp_pool(tmp_path_factory):
    pool = WorkerPool(tmp_path_factory.mktemp("ddp"), HERE, timeout_s=120, what="DDP")
    yield pool
    pool.close()
