"""Findings that are real only while a GradScaler scales or an autocast region is on carry the
setting that turns it on (`precision_runs.scaler_configuration` / `autocast_configuration`)."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source
from linter.types import Configuration


def lint(source: str, *codes: str):
    return analyze_source(textwrap.dedent(source), "train.py", list(codes))


# LlamaGen's train_c2i.py, cut to the scaler and the checkpoint
LLAMAGEN = """
import argparse

import torch


def main(args):
    model = build_model(args).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ptdtype = {'none': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}[
        args.mixed_precision
    ]
    scaler = torch.cuda.amp.GradScaler(enabled=(args.mixed_precision == 'fp16'))
    train_steps = 0
    for x, y in loader:
        with torch.cuda.amp.autocast(dtype=ptdtype):
            _, loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        train_steps += 1
        if train_steps % args.ckpt_every == 0:
            checkpoint = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "steps": train_steps,
                "args": args,
            }
            torch.save(checkpoint, f"{args.results_dir}/{train_steps:07d}.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-grad-norm", default=1.0, type=float)
    parser.add_argument("--ckpt-every", type=int, default=5000)
    parser.add_argument("--results-dir", type=str, default="results")
    parser.add_argument(
        "--mixed-precision", type=str, default='bf16', choices=["none", "fp16", "bf16"]
    )
    args = parser.parse_args()
    main(args)
"""
FP16_ONLY = "with --mixed-precision fp16 (default bf16)"


def test_scaler_state_not_saved_is_latent_when_the_scaler_is_on_for_fp16_only():
    (found,) = lint(LLAMAGEN, "ACL503")
    assert (found.code, found.start.line, found.start.column) == ("ACL503", 32, 12)
    assert found.severity == "warning"
    assert found.configuration == Configuration(False, FP16_ONLY, ("mixed_precision",))


def test_scaler_state_not_saved_affects_the_default_run_when_fp16_is_the_default():
    source = LLAMAGEN.replace("default='bf16', choices", "default='fp16', choices")
    (found,) = lint(source, "ACL503")
    assert found.start.line == 32
    assert found.configuration is not None and found.configuration.affects_default


def test_an_always_on_scaler_carries_no_configuration():
    source = LLAMAGEN.replace(
        "torch.cuda.amp.GradScaler(enabled=(args.mixed_precision == 'fp16'))",
        "torch.cuda.amp.GradScaler()",
    )
    (found,) = lint(source, "ACL503")
    assert (found.start.line, found.configuration) == (32, None)


def test_a_checkpoint_holding_the_scaler_is_clean():
    source = LLAMAGEN.replace(
        '"steps": train_steps,',
        '"scaler": scaler.state_dict(),\n                "steps": train_steps,',
    )
    assert lint(source, "ACL503") == []


# a store_true --amp switching the scaler (timm/DeiT style) --------------------------------------
AMP_FLAG = """
import argparse

import torch
from torch.cuda.amp import GradScaler, autocast

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true", help="use mixed precision")
parser.add_argument("--clip-grad", type=float, default=1.0)
args = parser.parse_args()

model = Net().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = GradScaler(enabled=args.amp)
for images, target in train_loader:
    with autocast(enabled=args.amp):
        loss = criterion(model(images), target)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
    optimizer.step()
"""
AMP_OFF = "with --amp (off by default)"


def test_scaler_protocol_findings_under_a_store_true_amp_are_latent():
    found = lint(AMP_FLAG, "ACL102", "ACL104")
    assert [(d.code, d.start.line, d.start.column) for d in found] == [
        ("ACL104", 20, 4),
        ("ACL102", 21, 4),
    ]
    for d in found:
        assert d.configuration == Configuration(False, AMP_OFF, ("amp",))
        assert d.severity == "warning"


def test_update_missing_under_a_store_true_amp_is_latent():
    source = AMP_FLAG.replace("    optimizer.step()\n", "    scaler.step(optimizer)\n").replace(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)\n", ""
    )
    (found,) = lint(source, "ACL103")
    assert (found.code, found.start.line) == ("ACL103", 20)
    assert found.configuration == Configuration(False, AMP_OFF, ("amp",))


def test_the_correct_amp_loop_is_clean():
    source = AMP_FLAG.replace(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)\n"
        "    optimizer.step()\n",
        "    scaler.unscale_(optimizer)\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n",
    )
    assert lint(source, "ACL102", "ACL103", "ACL104", "ACL202") == []


def test_backward_inside_an_autocast_switched_by_amp_is_latent():
    source = AMP_FLAG.replace(
        "        loss = criterion(model(images), target)\n    optimizer.zero_grad()\n"
        "    scaler.scale(loss).backward()\n",
        "        loss = criterion(model(images), target)\n        optimizer.zero_grad()\n"
        "        scaler.scale(loss).backward()\n",
    )
    (found,) = lint(source, "ACL202")
    assert (found.code, found.start.line) == ("ACL202", 19)
    assert found.configuration == Configuration(False, AMP_OFF, ("amp",))


# accelerator.autocast(): a no-op unless the Accelerator's precision is set ---------------------
MAGVIT = """
from accelerate import Accelerator


class VideoTokenizerTrainer:
    def __init__(self, model, dataset, accelerate_kwargs: dict = dict(), use_wandb=False):
        if use_wandb:
            accelerate_kwargs['log_with'] = 'wandb'
        self.accelerator = Accelerator(**accelerate_kwargs)
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.model, self.optimizer, self.dl = self.accelerator.prepare(
            self.model, self.optimizer, DataLoader(dataset)
        )

    def train_step(self):
        for data in self.dl:
            with self.accelerator.autocast():
                loss = self.model(data)
                self.accelerator.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
"""
ENGINE_OFF = (
    "with the Accelerator's mixed_precision set to fp16 or bf16 (`accelerate launch "
    "--mixed_precision`, `accelerate config`; default 'no')"
)


def test_backward_in_accelerator_autocast_is_latent_at_accelerates_default_precision():
    (found,) = lint(MAGVIT, "ACL202")
    assert (found.code, found.start.line, found.start.column) == ("ACL202", 20, 16)
    assert found.configuration == Configuration(False, ENGINE_OFF, ("mixed_precision",))
    assert found.severity == "warning"


def test_an_accelerator_told_fp16_affects_every_run():
    source = MAGVIT.replace(
        "Accelerator(**accelerate_kwargs)", 'Accelerator(mixed_precision="fp16")'
    )
    (found,) = lint(source, "ACL202")
    assert (found.start.line, found.configuration, found.severity) == (20, None, None)


def test_kwargs_that_may_set_the_precision_carry_no_configuration():
    source = MAGVIT.replace("accelerate_kwargs: dict = dict()", "accelerate_kwargs: dict")
    (found,) = lint(source, "ACL202")
    assert (found.start.line, found.configuration) == (20, None)
    given = MAGVIT.replace(
        "accelerate_kwargs['log_with'] = 'wandb'",
        "accelerate_kwargs['log_with'] = 'wandb'\n"
        "        accelerate_kwargs['mixed_precision'] = 'fp16'",
    )
    (found,) = lint(given, "ACL202")
    assert found.configuration is None


def test_accelerator_precision_flag_names_the_flag():
    source = """
    import argparse
    from accelerate import Accelerator

    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", type=str, default="no", choices=["no", "fp16", "bf16"])
    args = parser.parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.autocast():
            loss = model(**batch).loss
            accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    """
    (found,) = lint(source, "ACL202")
    assert (found.code, found.start.line) == ("ACL202", 13)
    assert found.configuration is not None and not found.configuration.affects_default
    assert "--mixed_precision" in found.configuration.condition


def test_backward_after_the_accelerator_autocast_is_clean():
    source = MAGVIT.replace(
        "                self.accelerator.backward(loss)\n",
        "            self.accelerator.backward(loss)\n",
    )
    assert lint(source, "ACL202") == []


# ACL504: a loss divided by K logs the loss itself while K is 1 ----------------------------------
DIVIDED_LOG = """
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--accumulation-steps", type=int, default=1)
args = parser.parse_args()

for idx, (samples, targets) in enumerate(data_loader):
    loss = criterion(model(samples), targets)
    loss = loss / args.accumulation_steps
    loss.backward()
    if (idx + 1) % args.accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
    loss_meter.update(loss.item(), targets.size(0))
"""


def test_a_logged_divided_loss_is_latent_while_k_defaults_to_one():
    (found,) = lint(DIVIDED_LOG, "ACL504")
    assert (found.code, found.start.line, found.start.column) == ("ACL504", 17, 22)
    assert found.configuration == Configuration(
        False, "with --accumulation-steps > 1 (default 1)", ("accumulation_steps",)
    )
    assert found.severity == "warning"


def test_a_logged_divided_loss_affects_the_default_run_with_k_above_one():
    source = DIVIDED_LOG.replace("type=int, default=1", "type=int, default=4")
    (found,) = lint(source, "ACL504")
    assert found.start.line == 17 and found.configuration.affects_default


def test_logging_the_undivided_loss_is_clean():
    source = DIVIDED_LOG.replace(
        "    loss = loss / args.accumulation_steps\n    loss.backward()\n",
        "    (loss / args.accumulation_steps).backward()\n",
    ).replace(
        "        optimizer.zero_grad()\n    loss_meter.update(",
        "        optimizer.zero_grad()\n        loss_meter.update(",
    )
    assert lint(source, "ACL504") == []


def test_a_scheduler_after_an_amp_switched_scaler_step_is_a_latent_hint():
    source = AMP_FLAG.replace(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)\n"
        "    optimizer.step()\n",
        "    scaler.step(optimizer)\n    scaler.update()\n    lr_scheduler.step()\n",
    )
    (found,) = lint(source, "ACL305")
    assert (found.code, found.start.line, found.severity) == ("ACL305", 22, "info")
    assert found.configuration == Configuration(False, AMP_OFF, ("amp",))


# ACL309: every accumulate() misuse is harmless while K is 1 --------------------------------------
TWO_ENTRIES = """
import argparse

from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
args = parser.parse_args()
accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
unet, text_encoder, optimizer, train_dataloader = accelerator.prepare(
    unet, text_encoder, optimizer, train_dataloader
)
for step, batch in enumerate(train_dataloader):
    with accelerator.accumulate(unet):
        with accelerator.accumulate(text_encoder):
            loss = compute_loss(unet, text_encoder, batch)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_accumulate_entered_twice_is_latent_while_k_defaults_to_one():
    (found,) = lint(TWO_ENTRIES, "ACL309")
    assert (found.code, found.start.line) == ("ACL309", 15)
    assert found.configuration == Configuration(
        False,
        "with --gradient_accumulation_steps > 1 (default 1)",
        ("gradient_accumulation_steps",),
    )
    assert found.severity == "warning"


def test_accumulate_entered_once_with_both_models_is_clean():
    source = TWO_ENTRIES.split("for step, batch")[0] + (
        "for step, batch in enumerate(train_dataloader):\n"
        "    with accelerator.accumulate(unet, text_encoder):\n"
        "        loss = compute_loss(unet, text_encoder, batch)\n"
        "        accelerator.backward(loss)\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    assert lint(source, "ACL309") == []


# A half model trained under a scaler that only `--amp` turns on: unscale_ fails only then
HALF_UNDER_AMP = """
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
args = parser.parse_args()

model = Net().cuda().half()
optimizer = torch.optim.AdamW(model.parameters())
scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16, enabled=args.amp):
        loss = criterion(model(x.cuda().half()), y.cuda())
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""


def test_fp16_parameters_under_a_store_true_amp_scaler_are_latent():
    (found,) = lint(HALF_UNDER_AMP, "ACL107")
    assert (found.start.line, found.start.column) == (10, 21)  # `half`
    assert found.configuration == Configuration(False, AMP_OFF, ("amp",))
    assert found.severity == "warning"  # an error made latent


def test_a_cast_under_its_own_switch_carries_no_configuration():
    switched = HALF_UNDER_AMP.replace(
        "model = Net().cuda().half()\n",
        "model = Net().cuda()\nif args.half_weights:\n    model = model.half()\n",
    )
    (found,) = lint(switched, "ACL107")
    assert (found.start.line, found.configuration, found.severity) == (12, None, None)
    always = HALF_UNDER_AMP.replace("enabled=args.amp)\nfor", "enabled=True)\nfor")
    (found,) = lint(always, "ACL107")
    assert (found.configuration, found.severity) == (None, None)
