"""ACL503 scaler-not-checkpointed: a training checkpoint without the GradScaler state."""

from __future__ import annotations

import pytest

SETUP = """
import torch

scaler = torch.amp.GradScaler("cuda")
opt = torch.optim.AdamW(model.parameters())
"""


def test_inline_dict_without_the_scaler(acl503, at):
    source = SETUP + 'torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, p)\n'
    assert acl503.findings(source) == [("ACL503", *at(source, "torch.save"))]


def test_dict_built_step_by_step(acl503, at):
    source = SETUP + (
        'ckpt = {"model": model.state_dict()}\n'
        'ckpt["optimizer"] = opt.state_dict()\n'
        'ckpt["epoch"] = epoch\n'
        "torch.save(ckpt, p)\n"
    )
    assert acl503.findings(source) == [("ACL503", *at(source, "torch.save"))]


def test_dict_call_and_an_aliased_save(acl503, at):
    source = SETUP + (
        "from torch import save as dump\n"
        "dump(dict(model=model.state_dict(), optim=opt.state_dict()), p)\n"
    )
    assert acl503.findings(source) == [("ACL503", *at(source, "dump(dict"))]


def test_trainer_class_with_a_runtime_enabled_scaler(acl503, at):
    source = """
    import torch

    class Trainer:
        def __init__(self, model, args):
            self.model = model
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            self.scaler = torch.cuda.amp.GradScaler(enabled=args.amp)

        def save(self, path):
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
            torch.save(state, path)
    """
    assert acl503.findings(source) == [("ACL503", *at(source, "torch.save"))]


def test_one_dict_saved_twice_is_one_finding(acl503, at):
    source = SETUP + (
        'ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict()}\n'
        "torch.save(ckpt, last)\n"
        "if best:\n"
        "    torch.save(ckpt, best_path)\n"
    )
    assert acl503.findings(source) == [("ACL503", *at(source, "torch.save(ckpt, last)"))]


@pytest.mark.parametrize(
    "save",
    [
        'torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), '
        '"scaler": scaler.state_dict()}, p)',
        'torch.save({"optimizer": opt.state_dict(), "amp": scaler.state_dict()}, p)',
        'ckpt = {"optimizer": opt.state_dict()}\nckpt["grad_scaler"] = scaler.state_dict()\n'
        "torch.save(ckpt, p)",
        'ckpt = {"optimizer": opt.state_dict()}\nckpt.update(loss_scale=scaler.state_dict())\n'
        "torch.save(ckpt, p)",
        "torch.save(model.state_dict(), p)",
        'torch.save({"model": model.state_dict(), "epoch": epoch}, p)',
        "accelerator.save_state(output_dir)",
        'torch.save({"optimizer": opt.state_dict(), **extra_state}, p)',
    ],
)
def test_scaler_under_any_key_weights_only_and_engine_saves_are_clean(acl503, save):
    assert acl503.findings(SETUP + save + "\n") == []


@pytest.mark.parametrize(
    "setup",
    [
        "import torch\nopt = torch.optim.AdamW(model.parameters())\n",
        'import torch\nscaler = torch.amp.GradScaler("cuda", enabled=False)\n'
        "opt = torch.optim.AdamW(model.parameters())\n",
    ],
)
def test_modules_without_an_enabled_scaler_are_clean(acl503, setup):
    source = setup + 'torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, p)\n'
    assert acl503.findings(source) == []


def test_dict_handed_to_a_helper_before_the_save_is_not_judged(acl503):
    source = SETUP + (
        'ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict()}\n'
        "for callback in callbacks:\n"
        "    callback.on_checkpoint_save(ckpt)\n"
        "torch.save(ckpt, p)\n"
    )
    assert acl503.findings(source) == []
