"""Accelerate's process helpers on `guard.Engine`: who runs first, who runs at all, splitting
inputs, padding, reducing and the cross-process trigger, with Accelerate's values.

Everything goes through `guard.distributed`, so one process gives the single-process answers
without any collective, as in Accelerate.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from guard import distributed


class DistributedType(str, enum.Enum):
    """The values of Accelerate's `DistributedType` this engine can be in (equal as strings)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    FSDP = "FSDP"


class EngineState:
    """What `accelerator.state` reports, read live from the engine (a view, not a copy)."""

    deepspeed_plugin = None
    megatron_lm_plugin = None
    fsdp_plugin = None

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        if name in _STATE_FIELDS:
            return getattr(self._engine, name)
        raise AttributeError(f"'EngineState' object has no attribute {name!r}")

    def __repr__(self) -> str:
        e = self._engine
        backend = f" Backend: {dist.get_backend()}" if distributed.is_initialized() else ""
        return (
            f"Distributed environment: {e.distributed_type.value}{backend}\n"
            f"Num processes: {e.num_processes}\nProcess index: {e.process_index}\n"
            f"Local process index: {e.local_process_index}\nDevice: {e.device}\n\n"
            f"Mixed precision type: {e.mixed_precision}\n"
        )


_STATE_FIELDS = {
    "distributed_type",
    "num_processes",
    "process_index",
    "local_process_index",
    "device",
    "mixed_precision",
    "use_distributed",
    "is_main_process",
    "is_local_main_process",
    "is_last_process",
}


class ProcessHelpers:
    """Mixin: Accelerate's process-level API, in Accelerate's semantics."""

    # ------------------------------------------------------------------------- who and where
    @property
    def local_process_index(self) -> int:
        return distributed.local_rank()

    @property
    def is_local_main_process(self) -> bool:
        return distributed.local_rank() == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def distributed_type(self) -> Any:
        """NO on one process, MULTI_GPU / MULTI_CPU on several (FSDP when a model is sharded);
        the member of Accelerate's own enum when the script imported it."""
        if self.num_processes == 1:
            kind = "NO"
        elif getattr(self, "fsdp_plugin", None) is not None:
            kind = "FSDP"
        else:
            kind = "MULTI_GPU" if self.device.type == "cuda" else "MULTI_CPU"
        theirs = sys.modules.get("accelerate.utils.dataclasses")
        enum_type = getattr(theirs, "DistributedType", DistributedType)
        return enum_type(kind)

    @property
    def state(self) -> EngineState:
        return EngineState(self)

    # ----------------------------------------------------------------------- who goes first
    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first; the others enter once it has left it."""
        with _goes_first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """As `main_process_first`, with the first process of each machine going first."""
        with _goes_first(self.is_local_main_process):
            yield

    def on_main_process(self, function: Callable | None = None) -> Callable:
        return _only_if(self, function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable | None = None) -> Callable:
        return _only_if(self, function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable) -> Callable:
        return _only_if(self, function, lambda: self.is_last_process)

    def on_process(self, function: Callable | None = None, process_index: int | None = None):
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only_if(self, function, lambda: self.process_index == process_index)

    def on_local_process(
        self, function: Callable | None = None, local_process_index: int | None = None
    ):
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _only_if(self, function, lambda: self.local_process_index == local_process_index)

    # ------------------------------------------------------------------ splitting, padding
    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of `inputs` (the first `len % W` processes get one
        more); with `apply_padding`, short shares repeat the last element of `inputs`."""
        world = self.num_processes
        if world == 1:
            yield inputs
            return
        length = len(next(iter(inputs.values()))) if isinstance(inputs, dict) else len(inputs)
        if isinstance(inputs, dict) and any(len(v) != length for v in inputs.values()):
            raise ValueError("All values in the dictionary must have the same length")
        share, extras = divmod(length, world)
        rank = self.process_index
        start = rank * share + min(rank, extras)
        stop = start + share + (1 if rank < extras else 0)
        target = share + (1 if extras else 0) if apply_padding else 0
        yield _split(inputs, start, stop, target, self.device)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        """Pad tensors (nested in lists, tuples, dicts) to the largest size along `dim` over all
        processes, so they can be gathered."""
        return _apply(_pad_one, tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum, mean or max of tensors (nested) over processes; "none" and one process: a copy."""
        if reduction not in ("sum", "mean", "max", "none"):
            raise ValueError(f"reduction must be sum, mean, max or none, not {reduction!r}")
        return _apply(_reduce_one, tensor, reduction=reduction)

    # --------------------------------------------------------------------------- trigger
    def set_trigger(self) -> None:
        """Raise this process's flag; `check_trigger` sees it on every process."""
        self.flag_tensor = torch.tensor(1, device=distributed.collective_device())

    def check_trigger(self) -> bool:
        """Whether any process set the trigger since the last check (then it is cleared)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=distributed.collective_device())
        if int(self.reduce(self.flag_tensor).item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=distributed.collective_device())
            return True
        return False

    # --------------------------------------------------------------------------- memory
    def free_memory(self, *objects: Any) -> list[None]:
        """Forget the prepared objects (to prepare new ones), restart the window and its step
        counters, collect garbage.

        Returns one None per argument, to assign back, as Accelerate's."""
        self._models.clear()
        self._optimizers.clear()
        self._schedulers.clear()
        self._dataloaders.clear()
        fresh = type(self._window)(self.gradient_accumulation_steps)
        self._window.load_state_dict(fresh.state_dict())
        self._items, self._grads_ready = None, False
        self._unscaled.clear()
        self.step = 0
        released: list[None] = [None for _ in objects]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return released

    def clear(self, *objects: Any) -> list[None]:
        return self.free_memory(*objects)


@contextlib.contextmanager
def _goes_first(first: bool) -> Iterator[None]:
    if not first:
        distributed.barrier()
    yield
    if first:
        distributed.barrier()


def _only_if(engine: Any, function: Callable | None, allowed: Callable[[], bool]) -> Callable:
    """`function` run where `allowed()` holds (everywhere on one process, as Accelerate's)."""
    if function is None:
        raise ValueError("use this decorator on a function: @engine.on_main_process")

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        runs = allowed() or not engine.use_distributed
        return function(*args, **kwargs) if runs else None

    return run


def _split(inputs: Any, start: int, stop: int, target: int, device: torch.device) -> Any:
    if isinstance(inputs, dict):
        return type(inputs)({k: _split(v, start, stop, target, device) for k, v in inputs.items()})
    part = inputs[start:stop]
    missing = target - len(part)
    if missing <= 0:
        return part
    if isinstance(inputs, torch.Tensor):
        filler = inputs[-1:].expand(missing, *inputs.shape[1:])
        return torch.cat([part.to(device), filler.to(device)])
    return part + type(part)([inputs[-1]] * missing)


def _apply(function: Callable, data: Any, **kwargs: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return function(data, **kwargs)
    if isinstance(data, dict):
        return type(data)({k: _apply(function, v, **kwargs) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        items = [_apply(function, v, **kwargs) for v in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    raise TypeError(f"expected tensors (nested in lists, tuples or dicts), not {type(data)}")


def _pad_one(tensor: torch.Tensor, dim: int, pad_index: Any, pad_first: bool) -> torch.Tensor:
    if not -tensor.dim() <= dim < tensor.dim():
        return tensor
    dim %= tensor.dim()
    sizes = distributed.gather(torch.tensor([tensor.shape], device=distributed.collective_device()))
    longest = int(sizes[:, dim].max())
    if longest == tensor.shape[dim]:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = longest
    padded = tensor.new_zeros(shape) + pad_index
    offset = longest - tensor.shape[dim] if pad_first else 0
    padded.narrow(dim, offset, tensor.shape[dim]).copy_(tensor)
    return padded


def _reduce_one(tensor: torch.Tensor, reduction: str) -> torch.Tensor:
    copy = tensor.clone()
    world = distributed.world_size()
    if world == 1 or reduction == "none":
        return copy
    dist.all_reduce(copy, op=dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM)
    if reduction == "mean":
        copy /= world
    return copy
