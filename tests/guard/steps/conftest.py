"""The two-rank worker runs once per session (a gloo process group costs seconds to start); the
ACL104 FSDP1 and ACL310 W=2 tests read its per-rank results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory) -> list[dict]:
    results = tmp_path_factory.mktemp("two-rank-results")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", ACCEL_GUARD="raise")
    command = [sys.executable, str(HERE / "two_rank_worker.py"), str(results)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0 and "terminated with signal" in done.stderr:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(results.glob("rank*.json"))]
    assert [r["rank"] for r in rows] == [0, 1]
    return rows


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; every test starts from a clean slate."""
    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
