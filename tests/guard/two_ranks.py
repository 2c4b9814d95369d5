"""Run a worker script that trains on 2 gloo processes and collect what each rank wrote.

Starting a process group costs seconds, so each test module runs its worker once and reads the
per-rank JSON files (`rank0.json`, `rank1.json`) the worker writes into a results folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_two_ranks(worker: Path, results: Path, *args: str, env: dict | None = None) -> list[dict]:
    """The ranks' rows, rank 0 first. The worker runs in raise mode with the repository on
    PYTHONPATH. A gloo process sometimes dies by SIGABRT at interpreter exit, after its rank
    wrote its results and left the process group ("terminate called without an active
    exception", seen on loaded 2-core machines): when both ranks' files were written, that
    teardown death is ignored; when one is missing, the worker is rerun once. Any other failure
    fails the test."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    full_env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", ACCEL_GUARD="raise")
    full_env.update(env or {})
    command = [sys.executable, str(worker), *args]
    for _ in range(2):
        for stale in results.glob("rank*.json"):
            stale.unlink()
        done = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=240)
        died_by_signal = done.returncode != 0 and "terminated with signal" in done.stderr
        if not died_by_signal or _both_ranks_wrote(results):
            break
    if not (died_by_signal and _both_ranks_wrote(results)):
        assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(p.read_text(encoding="utf-8")) for p in results.glob("rank*.json")]
    rows.sort(key=lambda row: row["rank"])
    assert [row["rank"] for row in rows] == [0, 1]
    return rows


def _both_ranks_wrote(results: Path) -> bool:
    return all((results / f"rank{rank}.json").is_file() for rank in (0, 1))
