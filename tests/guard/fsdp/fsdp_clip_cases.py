"""Clipping a sharded model, run on both ranks of the FSDP pool: the ways users clip FSDP2's
gradients, right and wrong (local shards), in warn mode so that a wrong clip trains on and its
harm can be measured. The clip lines carry a `# clip:` marker that the tests look up."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fsdp_reference import flat_params, make_data, make_model, make_optimizer

import guard

MAX_NORM = 0.05  # below every step's gradient norm (L2 and max): each step is clipped


def _clip(how: str, model: torch.nn.Module) -> float:
    """One clip, spelled as `how`; returns the norm it measured (this rank's view of it)."""
    params = list(model.parameters())
    if how == "dtensor":
        norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM)  # clip: dtensor
    elif how == "dtensor-norm":
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, MAX_NORM, norm)  # clip: dtensor-norm
    elif how == "all-reduced":  # local norms made global by hand: correct
        local = torch.nn.utils.get_total_norm([p.grad.to_local() for p in params]) ** 2
        dist.all_reduce(local)
        norm = local.sqrt()
        torch.nn.utils.clip_grads_with_norm_(params, MAX_NORM, norm)  # clip: all-reduced
    elif how == "dtensor-inf":
        norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM, norm_type=math.inf)
    elif how == "inf-all-reduced":  # the largest local entry, made global in place: correct
        norm = torch.nn.utils.get_total_norm([p.grad.to_local() for p in params], math.inf)
        dist.all_reduce(norm, op=dist.ReduceOp.MAX)
        torch.nn.utils.clip_grads_with_norm_(params, MAX_NORM, norm)  # clip: inf-all-reduced
    elif how == "to-local":
        shards = [p.to_local() for p in params]
        norm = torch.nn.utils.clip_grad_norm_(shards, MAX_NORM)  # clip: to-local
    elif how == "local-norm":
        norm = torch.nn.utils.get_total_norm([p.grad.to_local() for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, MAX_NORM, norm)  # clip: local-norm
    else:
        raise ValueError(how)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _model(sharded: bool) -> torch.nn.Module:
    model = make_model()
    if not sharded:
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def clip_loop(how: str, batch_size: int, steps: int, sharded: bool = True) -> dict:
    """SGD steps on this rank's part of each global batch, clipped as `how`, in warn mode."""
    guard.reset()
    guard.configure(mode="warn")
    try:
        model = _model(sharded)
        opt = make_optimizer("sgd", model.parameters())
        world, rank = dist.get_world_size(), dist.get_rank()
        x, y = make_data(steps * world * batch_size)
        norms = []
        for s in range(steps):
            rows = slice((s * world + rank) * batch_size, (s * world + rank + 1) * batch_size)
            F.mse_loss(model(x[rows]), y[rows]).backward()
            norms.append(_clip(how, model))
            opt.step()
            opt.zero_grad()
        findings = [[f.code, f.level, f.message, f.location] for f in guard.findings()]
        return {"params": flat_params(model), "norms": norms, "findings": findings}
    finally:
        guard.configure(mode="raise")


def value_clip_over_local_tensors() -> dict:
    """clip_grad_value_ over `p._local_tensor` (none has a .grad: torch itself then fails with
    an internal error), in raise mode: the guard's error comes first."""
    guard.reset()
    model = _model(sharded=True)
    opt = make_optimizer("sgd", model.parameters())
    x, y = make_data(4, seed=dist.get_rank())
    F.mse_loss(model(x), y).backward()
    try:
        shards = [p._local_tensor for p in model.parameters()]
        torch.nn.utils.clip_grad_value_(shards, MAX_NORM)  # clip: local-tensor-value
    except guard.GuardError as error:
        return {"raised": str(error), "location": error.location}
    finally:
        opt.zero_grad()
    return {"raised": None, "location": None}
