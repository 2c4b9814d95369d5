"""DDP test cases, run on both ranks of the session's gloo group by conftest's `ddp_pool`.

Each function runs on every rank and returns plain tensors and numbers for the test to compare.
"""

from __future__ import annotations

import torch
from engine_reference import (
    engine_run,
    flat_params,
    make_data,
    make_loader,
    make_model,
    make_optimizer,
    make_token_batches,
    make_token_model,
    token_loss,
)
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import guard


def _counting_allreduce(state: dict, bucket):
    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def accumulate_with_no_sync(samples: int, batch_size: int, n: int, opt_kind: str, clip):
    """Train through the engine, counting all-reduces and the DDP sync flag seen by forward."""
    engine = guard.Engine("no", gradient_accumulation_steps=n)
    model = make_model()
    opt = make_optimizer(opt_kind, model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    x, y = make_data(samples)
    model, opt, loader, sched = engine.prepare(model, opt, make_loader(x, y, batch_size), sched)
    counter = {"calls": 0}
    model.register_comm_hook(counter, _counting_allreduce)
    flags = []
    model.module.register_forward_pre_hook(
        lambda *_: flags.append(model.require_backward_grad_sync)
    )
    for xb, yb in loader:
        with engine.accumulate(model):
            engine.backward(torch.nn.functional.mse_loss(model(xb), yb))
            if clip is not None and engine.sync_gradients:
                engine.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            opt.zero_grad()
    return {
        "params": flat_params(model),
        "allreduces": counter["calls"],
        "forward_sync_flags": flags,
        "optimizer_steps": engine.optimizer_steps,
        "scheduler_steps": sched.scheduler.last_epoch,
        "world": engine.num_processes,
        "rank": engine.process_index,
    }


def scheduler_with_split_batches(samples: int, batch_size: int, n: int):
    engine = guard.Engine("no", gradient_accumulation_steps=n, split_batches=True)
    x, y = make_data(samples)
    _, sched = engine_run(engine, x, y, batch_size, "sgd", None)
    return sched.scheduler.last_epoch


def token_items(n: int, steps: int, use_items: bool):
    """Rank r trains on global batches r, r + W, ...; a window spans 2N global batches."""
    engine = guard.Engine("no", gradient_accumulation_steps=n)
    world, rank = engine.num_processes, engine.process_index
    batches = make_token_batches(world * n * steps)[rank::world]
    model = make_token_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.5))
    for tokens, labels in batches:
        with engine.accumulate(model):
            if use_items:
                loss = token_loss(model, tokens, labels, "sum")
                engine.backward(loss, num_items=(labels != -100).sum())
            else:
                engine.backward(token_loss(model, tokens, labels, "mean"))
            opt.step()
            opt.zero_grad()
    return flat_params(model)


def gather_metrics(samples: int, batch_size: int):
    """Evaluate over a prepared loader; return what gather and gather_for_metrics collected."""
    engine = guard.Engine("no")
    values = torch.arange(float(samples))
    loader = engine.prepare(
        torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(values), batch_size=batch_size, shuffle=False
        )
    )
    plain, for_metrics, local = [], [], []
    for (batch,) in loader:
        local.append(batch)
        plain.append(engine.gather(batch))
        for_metrics.append(engine.gather_for_metrics(batch))
    return torch.cat(plain), torch.cat(for_metrics), torch.cat(local)


def divided_by_world(n: int, divisor: int):
    """engine.backward(loss / divisor) on a prepared DDP model; returns the finding codes."""
    import warnings

    guard.reset()
    engine = guard.Engine("no", gradient_accumulation_steps=n)
    model = engine.prepare(make_model())
    x, y = make_data(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        with engine.accumulate(model):
            engine.backward(torch.nn.functional.mse_loss(model(x), y) / divisor)
    found = sorted(f.code for f in guard.findings())
    guard.reset()
    return found


def explicit_no_sync():
    """engine.no_sync(model) around forward and backward: no all-reduce; the next pass syncs."""
    engine = guard.Engine("no")
    model = engine.prepare(make_model())
    counter = {"calls": 0}
    model.register_comm_hook(counter, _counting_allreduce)
    x, y = make_data(4, seed=10 + engine.process_index)
    with engine.no_sync(model):
        engine.backward(torch.nn.functional.mse_loss(model(x), y))
    inside = counter["calls"]
    local = [p.grad.clone() for p in model.parameters()]
    engine.backward(torch.nn.functional.mse_loss(model(x), y))
    synced = [p.grad.clone() for p in model.parameters()]
    return {"inside": inside, "after": counter["calls"], "local": local, "synced": synced}


def token_counts_differ_across_ranks():
    """Each rank's micro-batches are uniform, but rank 1's hold a tenth of rank 0's tokens."""
    import warnings

    guard.reset()
    engine = guard.Engine("no", gradient_accumulation_steps=2)
    model = make_token_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tokens = torch.randint(0, 11, (2, 10))
    labels = tokens.clone()
    if engine.process_index == 1:
        labels[:, 1:] = -100
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", guard.GuardWarning)
        for _ in range(2):
            with engine.accumulate(model):
                engine.backward(token_loss(model, tokens, labels, "mean"))
                opt.step()
    found = sorted(f.code for f in guard.findings())
    guard.reset()
    return found


def token_mean_on_one_rank_only():
    """Rank 0 uses a token-mean loss, rank 1 a token sum divided by hand: the ranks see different
    things at the sync step, yet both must enter ACL308's gather (or the next collective, this
    case's own gather, would pair with it and hang or mix data)."""
    guard.reset()
    engine = guard.Engine("no", gradient_accumulation_steps=2)
    model = make_token_model()
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tokens = torch.randint(0, 11, (2, 10))
    for _ in range(2):
        with engine.accumulate(model):
            if engine.process_index == 0:
                engine.backward(token_loss(model, tokens, tokens, "mean"))
            else:
                engine.backward(token_loss(model, tokens, tokens, "sum") / tokens.numel())
            opt.step()
    ranks = engine.gather(torch.tensor([float(engine.process_index)])).tolist()
    found = sorted(f.code for f in guard.findings())
    guard.reset()
    return {"ranks": ranks, "found": found}


def user_wrapped_ddp(n: int):
    """A model the caller wrapped in DDP is kept as is, and accumulate() still applies no_sync."""
    engine = guard.Engine("no", gradient_accumulation_steps=n)
    ddp = torch.nn.parallel.DistributedDataParallel(make_model())
    model = engine.prepare(ddp)
    counter = {"calls": 0}
    model.register_comm_hook(counter, _counting_allreduce)
    x, y = make_data(4 * n, seed=20 + engine.process_index)
    for xb, yb in zip(x.split(4), y.split(4), strict=True):
        with engine.accumulate(model):
            engine.backward(torch.nn.functional.mse_loss(model(xb), yb))
    return {"same_object": model is ddp, "allreduces": counter["calls"]}
