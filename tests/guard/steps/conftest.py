"""The two-rank worker runs once per session (a gloo process group costs seconds to start); the
ACL104 FSDP1 and ACL310 W=2 tests read its per-rank results."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/guard, for the two-rank runner
from two_ranks import run_two_ranks  # noqa: E402


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory) -> list[dict]:
    results = tmp_path_factory.mktemp("two-rank-results")
    return run_two_ranks(HERE / "two_rank_worker.py", results, str(results))


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; every test starts from a clean slate."""
    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
