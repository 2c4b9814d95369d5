"""Two gloo processes on CPU: every drop-in process method of guard.Engine next to Accelerate's
Accelerator, in one run (a process group costs seconds). Each rank writes one JSON file of what
both libraries returned; the order in which ranks ran a block goes to a shared log file.

Run as a script (tests/guard/two_ranks.py starts it); the results folder comes in
ACCEL_DIST_RESULTS.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dropin_reference import Counter, flat_params, setup, train  # noqa: E402

N = 2  # micro-batches per optimizer step
STOP = 3  # micro-batches before the interruption: mid-window


def _plain(value):
    """JSON-able form of tensors and nested containers."""
    if isinstance(value, torch.Tensor):
        return {"tensor": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def identity(lib) -> dict:
    return {
        "distributed_type": str(lib.distributed_type.value),
        "use_distributed": lib.use_distributed,
        "num_processes": lib.num_processes,
        "process_index": lib.process_index,
        "local_process_index": lib.local_process_index,
        "is_main_process": lib.is_main_process,
        "is_local_main_process": lib.is_local_main_process,
        "is_last_process": lib.is_last_process,
        "state": [lib.state.num_processes, lib.state.process_index, str(lib.state.device)],
    }


def goes_first(lib, name: str, log: Path) -> None:
    """Append enter/leave lines to a shared log; the first process dawdles inside the block."""
    with open(log, "a", encoding="utf-8") as fh:
        with getattr(lib, name)():
            fh.write(f"{name} {lib.process_index} enter\n")
            fh.flush()
            if lib.process_index == 0:
                time.sleep(0.3)  # a missing barrier would let rank 1 in meanwhile
            fh.write(f"{name} {lib.process_index} leave\n")
            fh.flush()
    lib.wait_for_everyone()


def splits(lib) -> dict:
    out = {}
    cases = {
        "list": lambda: ["A", "B", "C"],
        "tensor": lambda: torch.arange(10).reshape(5, 2),
        "dict": lambda: {"a": [1, 2, 3], "b": torch.arange(3)},
        "one": lambda: ["only"],
    }
    for name, make in cases.items():
        for padding in (False, True):
            with lib.split_between_processes(make(), apply_padding=padding) as part:
                out[f"{name}_{padding}"] = _plain(part)
    return out


def pads_and_reductions(lib) -> dict:
    rank = lib.process_index
    ragged = torch.arange(2 * (rank + 2), dtype=torch.float32).reshape(rank + 2, 2)
    nested = {"x": ragged, "y": [ragged.T.contiguous()]}
    value = torch.tensor([rank + 1.0, 2.0 * rank])
    return {
        "pad_end": _plain(lib.pad_across_processes(ragged, pad_index=-1)),
        "pad_first": _plain(lib.pad_across_processes(ragged, dim=0, pad_first=True)),
        "pad_nested": _plain(lib.pad_across_processes(nested, dim=-1)),
        **{r: _plain(lib.reduce(value, reduction=r)) for r in ("sum", "mean", "max", "none")},
        "reduce_nested": _plain(lib.reduce({"a": [value, value * 2]})),
    }


def trigger(lib) -> list[bool]:
    if lib.process_index == 1:
        lib.set_trigger()
    return [lib.check_trigger(), lib.check_trigger()]


def on_main(lib) -> list:
    @lib.on_main_process
    def rank_of_main():
        return lib.process_index

    @lib.on_local_main_process
    def rank_of_local_main():
        return lib.process_index

    @lib.on_last_process
    def rank_of_last():
        return lib.process_index

    on_one = lib.on_process(lambda: lib.process_index, process_index=1)
    return [rank_of_main(), rank_of_local_main(), rank_of_last(), on_one()]


def checkpoint_files(lib, folder: Path) -> list[str]:
    """Train mid-window under DDP, save_state; the files this library wrote (after all ranks)."""
    lib.register_for_checkpointing(Counter())
    model, opt, loader, sched = setup(lib)
    train(lib, model, opt, loader, sched, stop=STOP)
    lib.save_state(folder)
    lib.wait_for_everyone()
    return sorted(os.listdir(folder))


def resume(folder: Path) -> dict:
    """An uninterrupted pass against one stopped mid-window, saved, loaded and finished."""
    import guard

    torch.manual_seed(7)
    whole = guard.Engine(gradient_accumulation_steps=N)
    model, opt, loader, sched = setup(whole)
    train(whole, model, opt, loader, sched)
    expected = flat_params(model)

    torch.manual_seed(7)
    first = guard.Engine(gradient_accumulation_steps=N)
    model, opt, loader, sched = setup(first)
    train(first, model, opt, loader, sched, stop=STOP)
    first.save_state(folder)
    first.wait_for_everyone()
    torch.manual_seed(100 + first.process_index)
    second = guard.Engine(gradient_accumulation_steps=N)
    model, opt, loader, sched = setup(second, seed=3)
    second.load_state(folder)
    train(second, model, opt, second.skip_first_batches(loader, STOP), sched)
    return {"equal": torch.equal(flat_params(model), expected), "steps": second.optimizer_steps}


class Recorder:
    """A custom tracker (Accelerate's GeneralTracker protocol) that records its calls."""

    name = "recorder"
    requires_logging_directory = False

    def __init__(self) -> None:
        self.calls: list = []
        self.tracker = self

    def start(self) -> None:
        self.calls.append("start")

    def store_init_configuration(self, values: dict) -> None:
        self.calls.append(["config", values])

    def log(self, values: dict, step=None, **kwargs) -> None:
        self.calls.append(["log", values, step])

    def finish(self) -> None:
        self.calls.append("finish")


def tracked(make) -> list:
    """init_trackers, log, end_training (which also ends the process group, as Accelerate's)."""
    from accelerate.tracking import GeneralTracker

    recorder_class = type("RecorderTracker", (Recorder, GeneralTracker), {})
    recorder = recorder_class()
    lib = make(log_with=[recorder])
    lib.init_trackers("project", config={"lr": 0.1})
    lib.log({"loss": 1.5}, step=3)
    lib.wait_for_everyone()
    return recorder.calls, lib


def cases(rank: int, results: Path) -> dict:
    from accelerate import Accelerator

    import guard

    libs = {
        "engine": guard.Engine(cpu=True, gradient_accumulation_steps=N),
        "accelerate": Accelerator(cpu=True, gradient_accumulation_steps=N),
    }
    out: dict = {"rank": rank}
    for name, lib in libs.items():
        out[name] = {
            "identity": identity(lib),
            "splits": splits(lib),
            "pads": pads_and_reductions(lib),
            "trigger": trigger(lib),
            "on_main": on_main(lib),
        }
        for block in ("main_process_first", "local_main_process_first"):
            goes_first(lib, block, results / f"{name}_order.log")
        out[name]["files"] = checkpoint_files(lib, results / f"{name}_checkpoint")
    out["resume"] = resume(results / "resume")
    engine_calls, engine = tracked(lambda **kw: guard.Engine(cpu=True, **kw))
    accelerate_calls, accelerator = tracked(lambda **kw: Accelerator(cpu=True, **kw))
    engine.end_training()  # finishes its trackers and ends the process group
    out["group_after_end"] = dist.is_initialized()
    accelerator.end_training()  # the group is gone: only its trackers finish
    out["engine"]["tracker"], out["accelerate"]["tracker"] = engine_calls, accelerate_calls
    return out


def run(rank: int, world: int, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = Path(os.environ["ACCEL_DIST_RESULTS"])
    out = cases(rank, results)
    with open(results / f"rank{rank}.json", "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(2, free), nprocs=2)
    sys.exit(0)
