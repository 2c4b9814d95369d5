"""Sharded checkpoints across world sizes: one epoch trained and saved by the FSDP2 engine on W
processes, loaded and continued on another W (the pool's 2 ranks or the pytest process alone,
which trains unsharded). The same function runs on either side."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fsdp_reference import flat_params, make_data, make_loader, make_model, make_optimizer

import guard

CLIP = 0.5


def full_optimizer_state(model, optimizer) -> torch.Tensor:
    """Every optimizer state tensor, gathered whole and flattened in parameter-name order."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    state = get_optimizer_state_dict(model, optimizer, options=options)["state"]
    return torch.cat(
        [
            value.reshape(-1).float()
            for name in sorted(state)
            for _, value in sorted(state[name].items())
            if isinstance(value, torch.Tensor)
        ]
    )


def _snapshot(engine, model, opt, sched) -> dict:
    return {
        "params": flat_params(model),
        "optimizer": full_optimizer_state(model, opt.optimizer),
        "optimizer_steps": engine.optimizer_steps,
        "scheduler_epoch": sched.scheduler.last_epoch,
        "lr": sched.get_last_lr()[0],
    }


def epoch_then_checkpoint(
    directory: str, samples: int, batch_size: int, n: int, load: bool, stop_after: int | None = None
):
    """Load `directory` first when `load` (else start fresh and save there after one epoch, or
    mid-epoch after `stop_after` optimizer steps); train one epoch of `samples` with the
    engine's clip; returns snapshots and findings."""
    guard.reset()
    engine = guard.Engine("no", gradient_accumulation_steps=n, fsdp_plugin=True)
    model = make_model(seed=7 if load else 0)  # loaded: everything must come from the files
    opt = make_optimizer("adamw", model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    x, y = make_data(samples)
    model, opt, loader, sched = engine.prepare(model, opt, make_loader(x, y, batch_size), sched)
    result = {"world": engine.num_processes, "sharded": type(next(model.parameters())).__name__}
    if load:
        engine.load_sharded_state(directory)
        result["loaded"] = _snapshot(engine, model, opt, sched)
    for xb, yb in loader:
        with engine.accumulate(model):
            engine.backward(F.mse_loss(model(xb), yb))
            if engine.sync_gradients:
                engine.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            sched.step()
            opt.zero_grad()
        if engine.optimizer_steps == stop_after:
            break
    result["trained"] = _snapshot(engine, model, opt, sched)
    if not load:
        engine.save_sharded_state(directory)
    result["findings"] = sorted([f.code, f.level, f.message] for f in guard.findings())
    return result
