"""ACL103 judged at the next scaled backward: the log-branch update bug raises there, before
the failing scaler.step; GAN loops (one scaler, two optimizers, one update) never trip it and
train exactly as without the guard."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

STEPS = 2


def _mlp(inputs: int, outputs: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, 16), nn.ReLU(), nn.Linear(16, outputs))


def _params(*models: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for m in models for p in m.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def test_acl103_raises_at_the_backward_after_a_skipped_update(guard_on):
    torch.manual_seed(0)
    model = _mlp(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    for i in range(2):  # update only on the logging iteration (i == 0)
        scaler.scale(F.mse_loss(model(x), y)).backward()
        scaler.step(optimizer)
        optimizer.zero_grad()
        if i == 0:
            scaler.update()
    before = _params(model)
    with pytest.raises(guard_on.GuardError) as info:
        scaler.scale(F.mse_loss(model(x), y)).backward()  # the third iteration starts
    assert info.value.code == "ACL103"
    message = str(info.value)
    assert "this scaled backward starts a new iteration" in message
    assert "test_acl103_next_backward.py:" in message  # names the earlier scaler.step line
    assert _same(before, _params(model))


def _gan_loop(style: str) -> list[torch.Tensor]:
    """A small fp16 GAN on CPU: one scaler, two optimizers, one update per iteration."""
    torch.manual_seed(0)
    gen, disc = _mlp(8, 2), _mlp(2, 1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.05)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    real = torch.randn(32, 2) + 1.0
    ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
    for _ in range(STEPS):
        noise = torch.randn(32, 8)

        def d_phase(noise):
            opt_d.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                fake = gen(noise).detach()
                d_real, d_fake = disc(real).float(), disc(fake).float()
            loss = F.binary_cross_entropy_with_logits(d_real, ones)
            loss = loss + F.binary_cross_entropy_with_logits(d_fake, zeros)
            scaler.scale(loss).backward()
            scaler.step(opt_d)
            if style == "zero_after_step":
                opt_d.zero_grad()  # then the generator's backward refills D's gradients

        def g_phase(noise):
            opt_g.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                out = disc(gen(noise)).float()  # runs through D, whose optimizer is STEPPED
            scaler.scale(F.binary_cross_entropy_with_logits(out, ones)).backward()
            scaler.step(opt_g)

        phases = (g_phase, d_phase) if style == "generator_first" else (d_phase, g_phase)
        for phase in phases:
            phase(noise)
        scaler.update()
    return _params(gen, disc)


@pytest.mark.parametrize("style", ["recipe", "zero_after_step", "generator_first"])
def test_acl103_gan_loops_stay_clean_and_train_as_unguarded(guard_on, style):
    guarded = _gan_loop(style)
    assert guard_on.findings() == []
    guard_on.uninstall()
    try:
        reference = _gan_loop(style)
    finally:
        guard_on.install()
    assert _same(guarded, reference)
    torch.manual_seed(0)
    assert not _same(guarded, _params(_mlp(8, 2), _mlp(2, 1)))  # it trained from that start


def test_acl103_next_backward_check_degrades_without_the_private_stage(guard_on, monkeypatch):
    from guard import _private

    _private.probe()
    monkeypatch.setitem(_private.FEATURES, "scaler_stage", False)
    torch.manual_seed(0)
    model = _mlp(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    scaler.scale(F.mse_loss(model(x), y)).backward()
    scaler.step(optimizer)
    scaler.scale(F.mse_loss(model(x), y)).backward()  # unknowable without the stage: no raise
    with pytest.raises(RuntimeError, match="already been called since the last update"):
        scaler.step(optimizer)  # torch's own error remains
    assert guard_on.findings() == []
    _private.reset_warnings()
