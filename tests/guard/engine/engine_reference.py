"""Shared by the engine tests and the DDP workers: small models, data, and reference loops.

The references are written the way a careful user writes them by hand (a large-batch loop, a
manual AMP accumulation loop), so the engine is compared with an independent computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
IN, HIDDEN, OUT = 6, 16, 3


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT)
    )


def make_data(samples: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(samples, IN, generator=gen), torch.randn(samples, OUT, generator=gen)


def make_loader(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def make_optimizer(kind: str, params, fused: bool = False) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, fused=fused or None)
    raise ValueError(kind)


def loss_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def large_batch_run(
    x,
    y,
    windows: list[int],
    batch_size: int,
    opt_kind: str,
    clip: float | None,
    device="cpu",
    sched_steps: int = 1,
) -> torch.Tensor:
    """Plain loop: one optimizer step per window, on the window's samples as one batch.

    `windows` lists the micro-batches per step; the loss is the mean over the window's samples.
    The scheduler steps `sched_steps` times per optimizer step (W, as Accelerate does).
    """
    model = make_model().to(device)
    opt = make_optimizer(opt_kind, model.parameters())
    # W scheduler steps per optimizer step, as one step with gamma ** W (a plain loop would not
    # step a scheduler twice in a row, and the guard rightly flags that as ACL305)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9**sched_steps)
    start = 0
    for micro in windows:
        stop = min(start + micro * batch_size, len(x))
        opt.zero_grad()
        loss_fn(model, x[start:stop].to(device), y[start:stop].to(device)).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        start = stop
    return flat_params(model)


def engine_run(engine, x, y, batch_size: int, opt_kind: str, clip: float | None, epochs=1):
    """The canonical Accelerate-style loop, through `engine` (a guard.Engine or an Accelerator)."""
    model = make_model()
    opt = make_optimizer(opt_kind, model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    model, opt, loader, sched = engine.prepare(model, opt, make_loader(x, y, batch_size), sched)
    for _ in range(epochs):
        for xb, yb in loader:
            with engine.accumulate(model):
                engine.backward(loss_fn(model, xb, yb))
                if clip is not None and engine.sync_gradients:
                    engine.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                sched.step()
                opt.zero_grad()
    return flat_params(model), sched


def windows_for(batches: int, n: int) -> list[int]:
    """Micro-batches per optimizer step for `batches` batches, the tail flushed."""
    full, tail = divmod(batches, n)
    return [n] * full + ([tail] if tail else [])


VOCAB, EMBED = 11, 8


def make_token_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, EMBED), torch.nn.Linear(EMBED, VOCAB))


def make_token_batches(count: int, rows: int = 2, width: int = 12, seed: int = 2) -> list:
    """Padded token batches of very different lengths (labels -100 on padding)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(count):
        tokens = torch.randint(0, VOCAB, (rows, width), generator=gen)
        labels = torch.randint(0, VOCAB, (rows, width), generator=gen)
        lengths = torch.randint(1, 4 if i % 2 else width + 1, (rows,), generator=gen)
        labels[torch.arange(width)[None, :] >= lengths[:, None]] = -100
        batches.append((tokens, labels))
    return batches


def token_loss(model, tokens, labels, reduction: str) -> torch.Tensor:
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction=reduction)


def token_reference(batches: list, steps: int, per_step: int) -> torch.Tensor:
    """Large batch: each step's loss is the mean over every valid token of its batches."""
    model = make_token_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for s in range(steps):
        window = batches[s * per_step : (s + 1) * per_step]
        tokens = torch.cat([t for t, _ in window])
        labels = torch.cat([lab for _, lab in window])
        opt.zero_grad()
        token_loss(model, tokens, labels, "mean").backward()
        opt.step()
    return flat_params(model)
