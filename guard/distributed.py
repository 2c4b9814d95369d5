"""The engine's view of torch.distributed: world size, rank, the default device, collectives.

Everything degrades to the single-process answer when torch.distributed is not initialised, so
the engine code never branches on "am I distributed" beyond `world_size() > 1`.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", rank()))


def init_from_env(device: torch.device) -> None:
    """Start the default process group when launched by torchrun (WORLD_SIZE > 1) and none exists.

    gloo for CPU devices, nccl for CUDA: the backends torch recommends for each.
    """
    if is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)


def default_device() -> torch.device:
    """cuda:<local rank> when CUDA is present, otherwise the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def collective_device() -> torch.device:
    """Where tensors for the default group's collectives must live: CUDA for nccl, else the CPU."""
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks in place (a no-op on one process)."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather(data: Any) -> Any:
    """Concatenate tensors (nested in tuples, lists, dicts) from every rank along dimension 0.

    0-d tensors become length-W vectors. Shapes must agree across ranks, as in Accelerate.
    """
    if isinstance(data, torch.Tensor):
        return _gather_tensor(data)
    if isinstance(data, dict):
        return type(data)({k: gather(v) for k, v in data.items()})
    if isinstance(data, (tuple, list)):
        gathered = [gather(v) for v in data]
        return type(data)(*gathered) if hasattr(data, "_fields") else type(data)(gathered)
    raise TypeError(f"gather expects tensors (nested in tuples, lists or dicts), not {type(data)}")


def _gather_tensor(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 0:
        tensor = tensor.unsqueeze(0)
    if world_size() == 1:
        return tensor
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=0)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
