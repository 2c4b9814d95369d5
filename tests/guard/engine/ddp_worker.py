"""One rank of the test session's 2-process gloo group (started by conftest's `ddp_pool`).

It joins the process group once, then runs test cases sent by the pytest process: each request
names a module file and a function in it; the function's return value (or the traceback) goes
back over the connection. Plain pickle, not the connection's own: torch's multiprocessing
reducers would share tensor memory, which needs an authkey this process does not have.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import traceback
from multiprocessing.connection import Client


def _load(path: str, cache: dict):
    if path not in cache:
        name = "ddp_case_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        cache[path] = module
    return cache[path]


def main() -> None:
    port, rank, world, store = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    conn = Client(("127.0.0.1", port), authkey=bytes.fromhex(os.environ["DDP_POOL_AUTHKEY"]))
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    send = lambda obj: conn.send_bytes(pickle.dumps(obj))  # noqa: E731
    send(("ready", rank))
    modules: dict = {}
    while True:
        request = pickle.loads(conn.recv_bytes())
        if request is None:
            break
        path, name, kwargs = request
        try:
            result = ("ok", getattr(_load(path, modules), name)(**kwargs))
        except BaseException:  # report everything, the pool turns it into a test failure
            result = ("error", traceback.format_exc())
        send(result)
    dist.destroy_process_group()
    conn.close()
    os._exit(0)  # skip interpreter teardown: the pytest session waits for this exit


if __name__ == "__main__":
    main()
