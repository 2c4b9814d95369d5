"""Shared by the drop-in tests and the two-rank worker: a small model with dropout (so the RNG
state matters), data, and one training loop written as Accelerate's examples write it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

IN, HIDDEN, OUT = 6, 16, 3


class Counter:
    """A user object registered for checkpointing (counts the micro-steps it has seen)."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(HIDDEN, OUT),
    )


def make_loader(samples: int, batch_size: int, order: str = "sequential") -> DataLoader:
    """order: "sequential", "shuffled" (by the global generator) or "own-generator"."""
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(samples, IN, generator=gen), torch.randn(samples, OUT, generator=gen)
    shuffle = order != "sequential"
    own = torch.Generator().manual_seed(2) if order == "own-generator" else None
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, generator=own)


def setup(engine, samples: int = 48, batch_size: int = 4, seed: int = 0, order="sequential"):
    """Model, AdamW, loader and a StepLR scheduler, prepared by `engine` (either library)."""
    model = make_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    return engine.prepare(model, opt, make_loader(samples, batch_size, order), sched)


def train(engine, model, opt, loader, sched, counter=None, stop=None, clip=0.5) -> int:
    """Accelerate's accumulate loop; stops after `stop` micro-batches (None: the whole pass)."""
    seen = 0
    for xb, yb in loader:
        with engine.accumulate(model):
            loss = F.mse_loss(model(xb), yb)
            engine.backward(loss)
            if clip is not None and engine.sync_gradients:
                engine.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            opt.zero_grad()
        seen += 1
        if counter is not None:
            counter.seen += 1
        if stop is not None and seen == stop:
            break
    return seen


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])
