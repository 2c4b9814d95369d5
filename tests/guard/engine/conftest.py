"""Fixtures for the engine tests: devices, Accelerate's singleton reset, and the DDP worker pool.

The pool starts one 2-process gloo group per test session (only when a DDP test asks for it);
each DDP test sends an importable function to both ranks and gets both results back.
"""

from __future__ import annotations

import inspect
import os
import pickle
import secrets
import subprocess
import sys
from multiprocessing.connection import Listener
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))  # engine_reference and ddp_cases are shared with the workers

WORLD = 2
TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def _reset_accelerate_state():
    """Accelerate keeps process-wide singletons; every test starts from a clean slate."""
    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


class DDPPool:
    """Runs module-level functions on every rank of a persistent gloo group."""

    def __init__(self, tmp: Path):
        authkey = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey)
        port = self._listener.address[1]
        env = dict(os.environ, DDP_POOL_AUTHKEY=authkey.hex())
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
        env["OMP_NUM_THREADS"] = "1"
        store = tmp / "store"
        worker = HERE / "ddp_worker.py"
        self._procs = [
            subprocess.Popen(
                [sys.executable, str(worker), str(port), str(r), str(WORLD), str(store)], env=env
            )
            for r in range(WORLD)
        ]
        conns = [self._listener.accept() for _ in range(WORLD)]
        ranks = [self._recv(c)[1] for c in conns]
        self._conns = [c for _, c in sorted(zip(ranks, conns, strict=True), key=lambda t: t[0])]

    def _recv(self, conn):
        if not conn.poll(TIMEOUT_S):
            self.close()
            raise TimeoutError("DDP worker did not answer in time")
        return pickle.loads(conn.recv_bytes())

    def run(self, func, **kwargs) -> list:
        """Call `func(**kwargs)` on every rank; returns the results by rank."""
        request = (inspect.getfile(func), func.__name__, kwargs)
        for conn in self._conns:
            conn.send_bytes(pickle.dumps(request))
        replies = [self._recv(conn) for conn in self._conns]
        errors = [f"rank {r}:\n{value}" for r, (kind, value) in enumerate(replies) if kind != "ok"]
        if errors:
            raise AssertionError("\n".join(errors))
        return [value for _, value in replies]

    def close(self) -> None:
        for conn in getattr(self, "_conns", []):
            try:
                conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._listener.close()


@pytest.fixture(scope="session")
def ddp_pool(tmp_path_factory):
    pool = DDPPool(tmp_path_factory.mktemp("ddp"))
    yield pool
    pool.close()
