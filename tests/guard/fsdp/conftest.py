"""The 2-process gloo group for the FSDP2 tests: started once per session, on first use.

It runs the engine tests' generic worker (`tests/guard/engine/ddp_worker.py`), which joins the
group and calls the module-level functions the tests send (here from `fsdp_cases.py`), in raise
mode: an error-level guard finding in a correct loop fails the test with its traceback.
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
WORKER = ROOT / "tests" / "guard" / "engine" / "ddp_worker.py"
sys.path.insert(0, str(HERE))  # fsdp_cases and fsdp_reference are shared with the workers
WORLD = 2
TIMEOUT_S = 180


class Pool:
    """Calls `func(**kwargs)` on both ranks of a persistent gloo group."""

    def __init__(self, tmp: Path):
        authkey = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey)
        env = dict(os.environ, DDP_POOL_AUTHKEY=authkey.hex(), OMP_NUM_THREADS="1")
        env["ACCEL_GUARD"] = "raise"
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
        port = str(self._listener.address[1])
        command = [sys.executable, str(WORKER), port, "{rank}", str(WORLD), str(tmp / "store")]
        self._procs = [
            subprocess.Popen([part.format(rank=r) for part in command], env=env)
            for r in range(WORLD)
        ]
        conns = [self._listener.accept() for _ in range(WORLD)]
        ranks = [self._recv(c)[1] for c in conns]
        self._conns = [c for _, c in sorted(zip(ranks, conns, strict=True), key=lambda t: t[0])]

    def _recv(self, conn):
        if not conn.poll(TIMEOUT_S):
            self.close()
            raise TimeoutError("FSDP worker did not answer in time")
        return pickle.loads(conn.recv_bytes())

    def run(self, func, **kwargs) -> list:
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
def fsdp_pool(tmp_path_factory):
    pool = Pool(tmp_path_factory.mktemp("fsdp"))
    yield pool
    pool.close()
