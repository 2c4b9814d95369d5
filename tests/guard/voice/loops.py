"""Training loops for the run report's tests. Each records, by its own means (host reads the
guard must not make), what the report's series should hold for every window."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FIELDS = ("step", "micro_batches", "tokens", "grad_norm", "lr", "loss_scale", "skipped")


def batches(count: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, labels) pairs of 4 samples, one label of each -100 (an ignored token)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        x = torch.randn(4, 8, generator=generator)
        y = torch.randint(0, 5, (4,), generator=generator)
        y[:1] = -100  # the same count in every batch: a token mean is exact here
        out.append((x, y))
    return out


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))


def new_window(expected: dict) -> None:
    for name in FIELDS:
        expected.setdefault(name, []).append(None)


def fp16_overflow_loop(overflow_window: int, scaled_clip_window: int, k: int = 2) -> dict:
    """fp16 with a GradScaler, K=2 over 9 batches (the last window has 1), an inf loss in
    `overflow_window` (the scaler skips that step) and a clip before unscale_ in
    `scaled_clip_window` (ACL104, a warning in warn mode). Returns the expected columns."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    data = batches(9)
    expected: dict = {"windows": 0, "skipped_windows": []}
    window, micro, tokens, steps = 1, 0, 0, 0
    for i, (x, y) in enumerate(data):
        with torch.autocast("cpu", dtype=torch.float16):
            logits = net(x)
        loss = F.cross_entropy(logits.float(), y) / k
        if window == overflow_window and micro == 0:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        micro += 1
        tokens += int((y != -100).sum())
        if (i + 1) % k and i != len(data) - 1:
            continue
        lr = opt.param_groups[0]["lr"]
        if window != scaled_clip_window:
            scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0).item()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped = scaler.get_scale() < scale
        row = dict(step=steps, micro_batches=micro, tokens=tokens, lr=lr, loss_scale=scale)
        row.update(grad_norm=None if skipped else norm, skipped=skipped)
        for name in FIELDS:
            expected.setdefault(name, []).append(row[name])
        if skipped:
            expected["skipped_windows"].append(window)
        else:
            steps += 1
            sched.step()
        opt.zero_grad()
        expected["windows"] = window
        window, micro, tokens = window + 1, 0, 0
    return expected


def engine_tail_loop(engine_cls, k: int = 3, count: int = 8) -> dict:
    """guard.Engine in bf16 with K=3 over 8 batches of a prepared loader: windows of 3, 3 and a
    2-batch tail that the engine steps on at the loader's end."""
    engine = engine_cls(mixed_precision="bf16", gradient_accumulation_steps=k, device="cpu")
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    xs, ys = zip(*batches(count), strict=True)
    loader = DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=4)
    net, opt, loader, sched = engine.prepare(net, opt, loader, sched)
    expected: dict = {"windows": 0, "skipped_windows": []}
    micro, tokens = 0, 0
    for x, y in loader:
        with engine.accumulate(net):
            engine.backward(F.cross_entropy(net(x), y))
            micro += 1
            tokens += int((y != -100).sum())
            if engine.sync_gradients:
                norm = engine.clip_grad_norm_(net.parameters(), 1.0).item()
                row = dict(step=expected["windows"], micro_batches=micro, tokens=tokens)
                row.update(grad_norm=norm, lr=opt.param_groups[0]["lr"], loss_scale=None)
                for name, value in dict(row, skipped=False).items():
                    expected.setdefault(name, []).append(value)
                expected["windows"] += 1
                micro, tokens = 0, 0
            opt.step()
            sched.step()
            opt.zero_grad()
    return expected


def plain_loop(windows: int, k: int = 2) -> dict:
    """fp32, K=2, no clipping (the guard computes the norm), `windows` steps."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    expected: dict = {"windows": windows, "skipped_windows": []}
    for window, start in enumerate(range(0, windows * k, k)):
        for x, y in batches(k, seed=start):
            (F.cross_entropy(net(x), y) / k).backward()
        grads = [p.grad for p in net.parameters()]
        expected.setdefault("grad_norm", []).append(
            torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
        )
        expected.setdefault("step", []).append(window)
        opt.step()
        opt.zero_grad()
    return expected
