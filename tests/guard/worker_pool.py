"""A persistent 2-process gloo group that runs the tests' module-level functions on every rank.

Starting a process group costs seconds, so a test session starts one pool, on first use, and
sends it each test's function (importable by file and name) and keyword arguments; every rank
runs it and the results come back by rank. The ranks run `tests/guard/engine/ddp_worker.py`.
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

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "guard" / "engine" / "ddp_worker.py"
WORLD = 2


class WorkerPool:
    """Calls `func(**kwargs)` on every rank of a persistent gloo group.

    `cases` is the folder of the modules the functions live in (put on the workers' path),
    `env` what the workers' environment adds (e.g. ACCEL_GUARD=raise), `what` names the pool
    in a timeout's message."""

    def __init__(self, tmp: Path, cases: Path, timeout_s: int, what: str, env: dict | None = None):
        self._timeout_s, self._what = timeout_s, what
        authkey = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey)
        full_env = dict(os.environ, DDP_POOL_AUTHKEY=authkey.hex(), OMP_NUM_THREADS="1")
        full_env.update(env or {})
        paths = [str(ROOT), str(cases), full_env.get("PYTHONPATH", "")]
        full_env["PYTHONPATH"] = os.pathsep.join(paths)
        port = str(self._listener.address[1])
        command = [sys.executable, str(WORKER), port, "{rank}", str(WORLD), str(tmp / "store")]
        self._procs = [
            subprocess.Popen([part.format(rank=r) for part in command], env=full_env)
            for r in range(WORLD)
        ]
        conns = [self._listener.accept() for _ in range(WORLD)]
        ranks = [self._recv(c)[1] for c in conns]
        self._conns = [c for _, c in sorted(zip(ranks, conns, strict=True), key=lambda t: t[0])]

    def _recv(self, conn):
        if not conn.poll(self._timeout_s):
            self.close()
            raise TimeoutError(f"{self._what} worker did not answer in time")
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
