"""`guard.uninstall()` restores every patched function and removes every hook: afterwards torch
trains a sample loop to the same bytes as a guard-free run, and no hook handle remains."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad
from torch.optim import optimizer as optim_mod

import guard
from guard import _install, _patch


def _patched_points() -> dict[str, object]:
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler

    autocast = torch.amp.autocast_mode.autocast
    scaler = torch.amp.GradScaler
    return {
        "autograd.backward": torch.autograd.backward,
        "Optimizer.__init__": torch.optim.Optimizer.__init__,
        "Optimizer.zero_grad": torch.optim.Optimizer.zero_grad,
        "Module.zero_grad": nn.Module.zero_grad,
        "GradScaler.scale": scaler.scale,
        "GradScaler.unscale_": scaler.unscale_,
        "GradScaler.step": scaler.step,
        "GradScaler.update": scaler.update,
        "utils.clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
        "clip_grad.clip_grad_norm_": clip_grad.clip_grad_norm_,
        "utils.clip_grad_value_": torch.nn.utils.clip_grad_value_,
        "LRScheduler.step": torch.optim.lr_scheduler.LRScheduler.step,
        "autocast.__enter__": autocast.__enter__,
        "autocast.__exit__": autocast.__exit__,
        "Accelerator.__init__": Accelerator.__init__,
        "Accelerator.prepare": Accelerator.prepare,
        "Accelerator.backward": Accelerator.backward,
        "Accelerator.accumulate": Accelerator.accumulate,
        "Accelerator.autocast": Accelerator.autocast,
        "Accelerator.clip_grad_norm_": Accelerator.clip_grad_norm_,
        "AcceleratedOptimizer.step": AcceleratedOptimizer.step,
        "AcceleratedScheduler.step": AcceleratedScheduler.step,
    }


def _train(model_seed: int = 0) -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(model_seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    for _ in range(4):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
    return model, [p.detach().clone() for p in model.parameters()]


def _global_hooks() -> tuple[int, int]:
    return len(optim_mod._global_optimizer_pre_hooks), len(optim_mod._global_optimizer_post_hooks)


def test_uninstall_restores_everything_and_torch_trains_identically():
    import accelerate  # noqa: F401  (patched too when installed)

    guard.uninstall()
    originals = _patched_points()
    hooks = _global_hooks()
    _, reference = _train()

    guard.install()
    guard.configure(mode="raise")
    changed = {k for k, v in _patched_points().items() if v is not originals[k]}
    assert changed == set(originals), f"not patched while installed: {set(originals) - changed}"
    guarded_model, guarded = _train()
    assert any(p._post_accumulate_grad_hooks for p in guarded_model.parameters())
    assert _global_hooks() == (hooks[0] + 1, hooks[1] + 1)

    guard.uninstall()
    after = _patched_points()
    assert {k for k in originals if after[k] is not originals[k]} == set()
    assert _global_hooks() == hooks
    assert not any(p._post_accumulate_grad_hooks for p in guarded_model.parameters())
    assert not _patch.active()
    assert _install._finder not in sys.meta_path
    model, plain = _train()
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())
    for a, b, c in zip(reference, guarded, plain, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    guard.install()  # leave the process as the other tests expect it


def test_when_imported_fires_for_modules_imported_later_and_earlier(tmp_path, monkeypatch):
    (tmp_path / "accel_guard_probe_mod.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    _install.when_imported("accel_guard_probe_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    import accel_guard_probe_mod  # noqa: F401

    assert seen == [42]
    _install.when_imported("accel_guard_probe_mod", lambda m: seen.append(m.VALUE + 1))
    assert seen == [42, 43]  # already imported: called at once
    sys.modules.pop("accel_guard_probe_mod")


def test_accelerate_imported_before_the_guard_is_patched_on_install():
    from accelerate import Accelerator

    guard.uninstall()
    original = Accelerator.prepare
    guard.install()
    assert Accelerator.prepare is not original
    assert Accelerator.prepare.__guard_original__ is original


def test_off_mode_installs_nothing():
    guard.uninstall()
    try:
        guard.configure(mode="off")
        assert guard.install() is False
        assert not _patch.active()
    finally:
        guard.configure(mode="raise")
        guard.install()


def test_clip_names_bound_before_install_are_rebound_and_restored():
    import types

    guard.uninstall()
    original = torch.nn.utils.clip_grad_norm_
    script = types.ModuleType("user_script")
    script.clip_grad_norm_ = original  # `from torch.nn.utils import clip_grad_norm_` ran first
    guard.install()
    from guard._tracker import TRACKER

    TRACKER.rebind_imported_clips([script])
    assert script.clip_grad_norm_ is torch.nn.utils.clip_grad_norm_
    assert script.clip_grad_norm_.__guard_original__ is original
    guard.uninstall()
    assert script.clip_grad_norm_ is original
    guard.install()
