"""FSDP2 cases, run on both ranks of the session's gloo group (conftest's `fsdp_pool`), with the
guard installed in raise mode. Each returns plain tensors, numbers and the guard's findings."""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fsdp_reference import flat_params, make_data, make_loader, make_model, make_optimizer
from torch.utils.data import DataLoader, TensorDataset

import guard


def _findings() -> list:
    return sorted([f.code, f.level, f.message] for f in guard.findings())


@contextlib.contextmanager
def counting_reduce_scatters(counter: dict):
    """Count the reduce-scatters FSDP2 issues (it calls torch.distributed.reduce_scatter_single)."""
    original = dist.reduce_scatter_single

    def counted(*args, **kwargs):
        counter["calls"] += 1
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counted
    try:
        yield
    finally:
        dist.reduce_scatter_single = original


def _engine(precision: str, n: int, init_scale: float | None = None, **kwargs):
    kwargs.setdefault("fsdp_plugin", True)
    engine = guard.Engine(precision, gradient_accumulation_steps=n, **kwargs)
    if init_scale is not None:
        engine.prepare(torch.amp.GradScaler("cpu", init_scale=init_scale))
    return engine


def _train(engine, model, opt, loader, sched, clip, counter, stop_after=None) -> list:
    """The canonical Accelerate-style loop; returns the clipped norms (sync steps only)."""
    norms = []
    with counting_reduce_scatters(counter):
        for xb, yb in loader:
            with engine.accumulate(model):
                engine.backward(F.mse_loss(model(xb), yb))
                if clip is not None and engine.sync_gradients:
                    norms.append(float(engine.clip_grad_norm_(model.parameters(), clip)))
                opt.step()
                sched.step()
                opt.zero_grad()
            if stop_after is not None and engine.optimizer_steps == stop_after:
                break
    return norms


def _units(model: torch.nn.Module) -> list[str]:
    from torch.distributed.fsdp import FSDPModule

    return [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]


def engine_train(precision, opt_kind, clip, samples, batch_size, n, init_scale=None, **kwargs):
    """Train through the FSDP2 engine, counting reduce-scatters."""
    guard.reset()
    engine = _engine(precision, n, init_scale, **kwargs)
    model = make_model()
    opt = make_optimizer(opt_kind, model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    x, y = make_data(samples)
    model, opt, loader, sched = engine.prepare(model, opt, make_loader(x, y, batch_size), sched)
    counter = {"calls": 0}
    norms = _train(engine, model, opt, loader, sched, clip, counter)
    return {
        "rank": engine.process_index,
        "world": engine.num_processes,
        "sharded": [type(p).__name__ for p in model.parameters()],
        "units": _units(model),
        "params": flat_params(model),
        "norms": norms,
        "reduce_scatters": counter["calls"],
        "optimizer_steps": engine.optimizer_steps,
        "scale": None if engine.scaler is None else engine.scaler.get_scale(),
        "findings": _findings(),
    }


def accelerate_plugin_train(plugin_fields: dict, **kwargs):
    """`engine_train` with Accelerate's FullyShardedDataParallelPlugin(fsdp_version=2,
    **plugin_fields), built on this rank (its __post_init__ reads the environment; whatever it
    sets there is undone afterwards)."""
    from accelerate import FullyShardedDataParallelPlugin

    environment = dict(os.environ)
    try:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, **plugin_fields)
    finally:
        os.environ.clear()
        os.environ.update(environment)
    return engine_train(fsdp_plugin=plugin, **kwargs)


def engine_ddp_train(precision, samples, batch_size, n, init_scale=None, **kwargs):
    """The same loop through the DDP engine (the oracle for the tail window and num_items)."""
    guard.reset()
    engine = guard.Engine(precision, gradient_accumulation_steps=n, **kwargs)
    if init_scale is not None:
        engine.prepare(torch.amp.GradScaler("cpu", init_scale=init_scale))
    model = make_model()
    opt = make_optimizer("sgd", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    x, y = make_data(samples)
    model, opt, loader, sched = engine.prepare(model, opt, make_loader(x, y, batch_size), sched)
    _train(engine, model, opt, loader, sched, None, {"calls": 0})
    steps = engine.optimizer_steps
    return {"params": flat_params(model), "findings": _findings(), "optimizer_steps": steps}


def engine_items(n: int, steps: int, fsdp: bool):
    """`backward(loss_sum, num_items=)` with uneven item counts per micro-batch and rank."""
    guard.reset()
    engine = guard.Engine("no", gradient_accumulation_steps=n, fsdp_plugin=fsdp or None)
    world, rank = engine.num_processes, engine.process_index
    model = make_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.2))
    x, y = make_data(world * n * steps * 3)
    counter = {"calls": 0}
    with counting_reduce_scatters(counter):
        for i in range(rank, world * n * steps, world):
            rows = 1 + (i % 3)  # 1 to 3 samples: the window's mean needs every rank's count
            xb, yb = x[3 * i : 3 * i + rows], y[3 * i : 3 * i + rows]
            with engine.accumulate(model):
                loss = F.mse_loss(model(xb), yb, reduction="none").mean(dim=1).sum()
                engine.backward(loss, num_items=rows)
                opt.step()
                opt.zero_grad()
    return {"params": flat_params(model), "reduce_scatters": counter["calls"]}


def engine_resume(
    directory: str, samples: int, batch_size: int, n: int, cut: int, noisy: bool = False
):
    """Uninterrupted vs. saved after `cut` optimizer steps, rebuilt, loaded and continued.
    `noisy`: a dropout after the blocks and a shuffled loader, so the continued run is exact only
    if the checkpoint restored each rank's generators and the pass's order."""

    def build(seed: int = 0):
        model = make_model(seed=seed)
        return torch.nn.Sequential(model, torch.nn.Dropout(0.3)) if noisy else model

    def loader_of(x, y):
        return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=noisy)

    results = {}
    for how in ("straight", "resumed"):
        guard.reset()
        engine = _engine("bf16", n)
        model = build()
        opt = make_optimizer("adamw", model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        x, y = make_data(samples)
        model, opt, loader, sched = engine.prepare(model, opt, loader_of(x, y), sched)
        torch.manual_seed(123 + engine.process_index)  # both runs draw the same masks and order
        counter = {"calls": 0}
        if how == "resumed":
            _train(engine, model, opt, loader, sched, 0.5, counter, stop_after=cut)
            engine.save_sharded_state(directory)
            results["saved_steps"] = engine.optimizer_steps
            engine = _engine("bf16", n)
            model = build(seed=7)  # different weights and generators: all must come from files
            opt = make_optimizer("adamw", model.parameters())
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
            model, opt, loader, sched = engine.prepare(model, opt, loader_of(x, y), sched)
            engine.load_sharded_state(directory)
            loader = engine.skip_first_batches(loader, cut * n)
        _train(engine, model, opt, loader, sched, 0.5, counter)
        results[how] = flat_params(model)
        results[how + "_steps"] = engine.optimizer_steps
        results[how + "_lr"] = sched.get_last_lr()[0]
    results["findings"] = _findings()
    return results


def engine_mid_window_save(directory: str):
    """Saving mid-window is refused: FSDP2 holds that window's gradients unsharded."""
    engine = _engine("no", 2)
    model = make_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = make_data(4)
    with engine.accumulate(model):
        engine.backward(F.mse_loss(model(x), y))
    try:
        engine.save_sharded_state(directory)
    except RuntimeError as error:
        return str(error)
    return None


# -- raw loops under the guard ---------------------------------------------------------------------


def _fully_shard(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def raw_fsdp2_loop(sync_off: bool, fp16: bool, n: int = 2, steps: int = 2):
    """A hand-written FSDP2 accumulation loop: loss / n, gradient sync off on the first n - 1
    micro-batches when `sync_off`, fp16 autocast with a GradScaler when `fp16`, unscale and
    torch's clip_grad_norm_ over the DTensor parameters at the step."""
    guard.reset()
    model = _fully_shard(make_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", enabled=fp16)
    x, y = make_data(4 * n * steps, seed=dist.get_rank())
    counter, norms = {"calls": 0}, []
    with counting_reduce_scatters(counter):
        for i in range(n * steps):
            last = (i + 1) % n == 0
            if sync_off:
                model.set_requires_gradient_sync(last)
            with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
                out = model(x[4 * i : 4 * i + 4])
            loss = F.mse_loss(out.float(), y[4 * i : 4 * i + 4]) / n
            scaler.scale(loss).backward()
            if last:
                scaler.unscale_(opt)
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor())
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
    return {"findings": _findings(), "reduce_scatters": counter["calls"], "norms": norms}


def _overflow_on_rank_one(params) -> None:
    """Simulate an fp16 overflow confined to rank 1's shard of the gradients."""
    if dist.get_rank() == 1:
        grad = next(p.grad for p in params if p.grad is not None)
        local(grad).view(-1)[0] = float("inf")


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def scaler_with_a_one_rank_overflow(kind: str):
    """One step whose gradients overflow only in rank 1's shard: "fsdp1-amp" (FSDP1 with
    torch.amp.GradScaler: rank 0 steps, rank 1 skips), "fsdp1-sharded" (ShardedGradScaler) and
    "fsdp2-amp" (FSDP2's DTensor gradients) agree."""
    guard.reset()
    if kind.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(make_model(), device_id=torch.device("cpu"))
    else:
        model = _fully_shard(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if kind == "fsdp1-sharded":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler("cpu")
    else:
        scaler = torch.amp.GradScaler("cpu")
    x, y = make_data(4, seed=dist.get_rank())
    scaler.scale(F.mse_loss(model(x), y)).backward()
    _overflow_on_rank_one(list(model.parameters()))
    before = torch.cat([local(p.detach()).reshape(-1) for p in model.parameters()]).clone()
    raised = None
    try:
        scaler.step(opt)
    except guard.GuardError as error:
        raised = str(error)
    after = torch.cat([local(p.detach()).reshape(-1) for p in model.parameters()])
    scaler.update()
    return {"raised": raised, "stepped": not torch.equal(before, after), "findings": _findings()}
