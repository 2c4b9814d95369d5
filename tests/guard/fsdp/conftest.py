"""The 2-process gloo group for the FSDP2 tests: started once per session, on first use.

It runs the engine tests' generic worker (`tests/guard/engine/ddp_worker.py`), which joins the
group and calls the module-level functions the tests send (here from `fsdp_cases.py`), in raise
mode: an error-level guard finding in a correct loop fails the test with its traceback.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fsdp_cases and fsdp_reference are shared with the workers
sys.path.insert(0, str(HERE.parent))  # tests/guard, for the worker pool
from worker_pool import WorkerPool  # noqa: E402


@pytest.fixture(scope="session")
def fsdp_pool(tmp_path_factory):
    pool = WorkerPool(
        tmp_path_factory.mktemp("fsdp"),
        HERE,
        timeout_s=180,
        what="FSDP",
        env={"ACCEL_GUARD": "raise"},
    )
    yield pool
    pool.close()


@pytest.fixture
def one_rank_group():
    """A 1-process gloo group, so that `fully_shard` runs in this process; torn down after."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()
