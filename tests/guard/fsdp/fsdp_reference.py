"""Shared by the FSDP2 tests and their workers: a model with blocks, data, and the single-process
large-batch reference a careful user would write by hand."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

IN, HIDDEN, OUT = 6, 16, 3


class Net(torch.nn.Module):
    """An input layer, two blocks in a ModuleList (the engine's default FSDP2 units), a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(IN, HIDDEN)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2))
        self.out = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        for block in self.blocks:
            h = torch.tanh(block(h))
        return self.out(h)


UNITS = 3  # FSDP2 units holding parameters: the two blocks and the root (inp, out)


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return Net()


def make_data(samples: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(samples, IN, generator=gen), torch.randn(samples, OUT, generator=gen)


def make_loader(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def make_optimizer(kind: str, params) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter, gathered whole when it is a DTensor shard."""
    full = [getattr(p, "full_tensor", lambda p=p: p)() for p in model.parameters()]
    return torch.cat([p.detach().reshape(-1).float() for p in full])


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def large_batch(x, y, steps: int, per_step: int, opt_kind: str, clip: float | None, gamma=0.81):
    """One optimizer step per `per_step` samples, on them as one batch; returns the parameters
    and the unclipped norms. The scheduler's gamma is 0.9**W: the engine steps it W times."""
    model = make_model()
    opt = make_optimizer(opt_kind, model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma)
    norms = []
    for s in range(steps):
        opt.zero_grad()
        batch = slice(s * per_step, (s + 1) * per_step)
        F.mse_loss(model(x[batch]), y[batch]).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        sched.step()
    return flat_params(model), norms
