"""ACL105/ACL106/ACL204 bugs that live between two settings: the autocast dtype and the
scaler's `enabled=` (or the Accelerator's precision) read the same knob differently."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source

# nanoGPT's train.py, cut to what decides the precision
NANOGPT = """
import os
import time
from contextlib import nullcontext

import torch

from model import GPTConfig, GPT

out_dir = 'out'
gradient_accumulation_steps = 5 * 8
batch_size = 12
learning_rate = 6e-4
grad_clip = 1.0
device = 'cuda'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
compile = True
config_keys = [
    k for k, v in globals().items()
    if not k.startswith('_') and isinstance(v, (int, float, bool, str))
]
exec(open('configurator.py').read())
config = {k: globals()[k] for k in config_keys}

device_type = 'cuda' if 'cuda' in device else 'cpu'
ptdtype = {
    'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16
}[dtype]
ctx = (
    nullcontext() if device_type == 'cpu'
    else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
)

model = GPT(GPTConfig())
model.to(device)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), device_type)

X, Y = get_batch('train')
while True:
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch('train')
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
"""
SCALER = "scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))"
AUTOCAST = "torch.amp.autocast(device_type=device_type, dtype=ptdtype)"


def lint(source: str, *codes: str):
    return analyze_source(textwrap.dedent(source), "train.py", list(codes))


def found(source: str, *codes: str):
    return [(d.code, d.start.line, d.start.column) for d in lint(source, *codes)]


PRECISION = ("ACL105", "ACL106", "ACL204")


# nanoGPT and its forks --------------------------------------------------------------------
def test_nanogpts_own_recipe_is_clean():
    assert found(NANOGPT, *PRECISION) == []
    amp_api = NANOGPT.replace(
        SCALER, "scaler = torch.amp.GradScaler('cuda', enabled=(dtype == 'float16'))"
    )
    assert found(amp_api, *PRECISION) == []
    positional_device = NANOGPT.replace(AUTOCAST, "torch.autocast(device_type, dtype=ptdtype)")
    assert found(positional_device, *PRECISION) == []


def test_autocast_without_dtype_beside_a_float16_only_scaler(at):
    source = NANOGPT.replace(AUTOCAST, "torch.amp.autocast(device_type=device_type)")
    assert found(source, *PRECISION) == [("ACL106", *at(source, "ctx:"))]
    (d,) = lint(source, "ACL106")
    condition = "with dtype='bfloat16' or dtype='float32'"
    line = at(source, "scaler.scale(loss).backward()")[0]
    assert d.message.startswith(
        f"autocast runs this forward in float16 by default on CUDA {condition}, where "
        f"`scaler` is disabled: its loss is backpropagated on line {line} without loss scaling"
    )
    # bf16 is the default wherever the GPU supports it: the default run is the broken one
    assert (d.configuration.affects_default, d.configuration.condition) == (True, condition)
    assert d.configuration.knobs == ("dtype",)
    assert d.severity is None


def test_a_scaler_on_for_bf16_too(at):
    source = NANOGPT.replace(
        SCALER, "scaler = torch.cuda.amp.GradScaler(enabled=dtype in ['float16', 'bfloat16'])"
    )
    assert found(source, *PRECISION) == [("ACL105", *at(source, "torch.cuda.amp.GradScaler("))]
    (d,) = lint(source, "ACL105")
    assert d.message.startswith(
        "GradScaler `scaler` is on in a bf16 run with dtype='bfloat16': bf16 has fp32's range"
    )
    assert d.configuration.affects_default
    assert d.fix is None  # under float16 the scaler is needed


def test_an_inverted_scaler_is_wrong_both_ways(at):
    source = NANOGPT.replace(
        SCALER, "scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'bfloat16'))"
    )
    assert found(source, *PRECISION) == [
        ("ACL105", *at(source, "torch.cuda.amp.GradScaler(")),
        ("ACL106", *at(source, "ctx:")),
    ]
    acl105, acl106 = lint(source, "ACL105", "ACL106")
    assert acl105.configuration.condition == "with dtype='bfloat16'"
    assert acl106.configuration.condition == "with dtype='float16'"
    assert "where `scaler` is disabled" in acl106.message


def test_a_scaler_keyed_on_the_torch_dtype_is_clean():
    source = NANOGPT.replace(
        SCALER, "scaler = torch.cuda.amp.GradScaler(enabled=(ptdtype == torch.float16))"
    )
    assert found(source, *PRECISION) == []


HARDWARE_DTYPE = """
from contextlib import nullcontext

import torch

device = "cuda:0" if torch.cuda.is_available() else "cpu"
device_type = "cuda" if "cuda" in device else "cpu"
gradient_accumulation_steps = 32
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, dtype=ptdtype)
model = GPT(config).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
for it in range(max_iters):
    X, Y = get_batch("train")
    with ctx:
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
    scaler.scale(loss).backward()
    if (it + 1) % gradient_accumulation_steps == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
"""


def test_a_dtype_the_machine_picks_without_a_configurator(at):
    """The line copied from nanoGPT into a script of its own: the machine is the setting."""
    assert found(HARDWARE_DTYPE, *PRECISION) == []
    source = HARDWARE_DTYPE.replace(
        "torch.amp.autocast(device_type, dtype=ptdtype)", "torch.amp.autocast(device_type)"
    )
    assert found(source, *PRECISION) == [("ACL106", *at(source, "ctx:"))]
    (d,) = lint(source, "ACL106")
    assert d.configuration.condition == "on a GPU with bf16 support"
    assert d.configuration.affects_default and d.configuration.knobs == ()
    assert "float16 by default on CUDA on a GPU with bf16 support, where `scaler` is" in (d.message)


MINIMIND = """
import argparse
from contextlib import nullcontext

import torch
from torch import optim


def train_epoch(epoch):
    for step, (X, Y, loss_mask) in enumerate(train_loader):
        X, Y = X.to(args.device), Y.to(args.device)
        with ctx:
            out = model(X, Y)
            loss = out.last_loss / args.accumulation_steps
        scaler.scale(loss).backward()
        if (step + 1) % args.accumulation_steps == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Tiny-LLM Pretraining")
    parser.add_argument(
        "--device", type=str, default="cuda:0" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument("--dtype", type=str, default="bfloat16", help="Data type")
    parser.add_argument("--accumulation_steps", type=int, default=8)
    parser.add_argument("--grad_clip", type=float, default=1.0)
    parser.add_argument("--gpus", type=str, default="0,1")
    args = parser.parse_args()
    if args.gpus is not None:
        if torch.cuda.is_available():
            args.device = "cuda:0"
        else:
            args.device = "cpu"
    device_type = "cuda" if "cuda" in args.device else "cpu"
    ctx = nullcontext() if device_type == "cpu" else torch.cuda.amp.autocast()
    model = build_model()
    scaler = torch.cuda.amp.GradScaler(enabled=(args.dtype in ["float16", "bfloat16"]))
    optimizer = optim.AdamW(model.parameters(), lr=2e-4)
    for epoch in range(args.epochs):
        train_epoch(epoch)
"""


def test_a_minimind_style_script_with_a_free_form_dtype_flag(at):
    """`--dtype` without choices: a value the script never names turns the scaler off while
    the autocast (no dtype) stays fp16; the device flag, reassigned after the parse, and the
    machine do not change that."""
    assert found(MINIMIND, *PRECISION) == [("ACL106", *at(MINIMIND, "ctx:"))]
    (d,) = lint(MINIMIND, "ACL106")
    condition = "with --dtype not in ('bfloat16', 'float16') (default bfloat16)"
    assert d.configuration.condition == condition
    assert d.configuration.knobs == ("dtype",) and not d.configuration.affects_default
    keyed = MINIMIND.replace('enabled=(args.dtype in ["float16", "bfloat16"])', "enabled=True")
    assert found(keyed, *PRECISION) == []


# fp16 selectable, no scaler anywhere ------------------------------------------------------------
FLAG = """
import argparse

import torch

from model import GPT


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--dtype", type=str, default="bfloat16", choices=["float32", "bfloat16", "float16"]
    )
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()
    ptdtype = {
        "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16
    }[args.dtype]
    model = GPT().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for x, y in loader:
        with torch.autocast(device_type="cuda", dtype=ptdtype):
            logits, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
"""


def test_a_float16_choice_without_any_scaler_is_latent(at):
    assert found(FLAG, *PRECISION) == [("ACL106", *at(FLAG, "torch.autocast("))]
    (d,) = lint(FLAG, "ACL106")
    assert "with --dtype float16 (default bfloat16), and the module builds no GradScaler" in (
        d.message
    )
    assert d.configuration.affects_default is False
    assert d.configuration.condition == "with --dtype float16 (default bfloat16)"
    assert d.severity == "warning"  # harmless in the default run: one level lower


def test_the_float16_choice_with_its_scaler_is_clean():
    scaled = FLAG.replace(
        "    for x, y in loader:",
        '    scaler = torch.amp.GradScaler("cuda", enabled=(args.dtype == "float16"))\n'
        "    for x, y in loader:",
    ).replace(
        "        loss.backward()\n        optimizer.step()",
        "        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n"
        "        scaler.update()",
    )
    assert found(scaled, *PRECISION) == []
    no_fp16 = FLAG.replace(
        'choices=["float32", "bfloat16", "float16"]', 'choices=["float32", "bfloat16"]'
    )
    assert found(no_fp16, *PRECISION) == []


def test_a_configurable_global_dtype_without_a_scaler(at):
    source = """
    import torch

    from model import GPT

    batch_size = 12
    learning_rate = 6e-4
    dtype = 'bfloat16'
    config_keys = [k for k, v in globals().items() if not k.startswith('_')]
    exec(open('configurator.py').read())

    ptdtype = {
        'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16
    }[dtype]
    ctx = torch.amp.autocast(device_type='cuda', dtype=ptdtype)
    model = GPT().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    while True:
        X, Y = get_batch('train')
        with ctx:
            logits, loss = model(X, Y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """
    assert found(source, *PRECISION) == [("ACL106", *at(source, "ctx:"))]
    (d,) = lint(source, "ACL106")
    assert d.configuration.condition == "with dtype='float16' (default 'bfloat16')"
    assert not d.configuration.affects_default
    pinned = source.replace("exec(open('configurator.py').read())\n", "")
    assert found(pinned, *PRECISION) == []  # no configurator: dtype is a constant


def test_flags_that_only_misuse_together_or_switch_both_are_clean():
    both = """
    import argparse
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    scaler = torch.cuda.amp.GradScaler(enabled=args.fp16)
    amp_dtype = torch.bfloat16 if args.bf16 else torch.float16
    for batch in loader:
        with torch.autocast("cuda", dtype=amp_dtype, enabled=args.fp16 or args.bf16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    """
    assert found(both, *PRECISION) == []
    one_switch = """
    import argparse
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true", help="mixed precision")
    args = parser.parse_args()
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
    for images, target in train_loader:
        with torch.cuda.amp.autocast(enabled=args.amp):
            loss = criterion(model(images), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    assert found(one_switch, *PRECISION) == []


def test_the_autocast_always_on_while_the_scaler_follows_a_flag(at):
    source = """
    import argparse
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--amp", action="store_true", help="scale the loss")
    args = parser.parse_args()
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
    for images, target in train_loader:
        with torch.cuda.amp.autocast():
            loss = criterion(model(images), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    assert found(source, *PRECISION) == [("ACL106", *at(source, "torch.cuda.amp.autocast()"))]
    (d,) = lint(source, "ACL106")
    assert d.configuration.condition == "without --amp"
    assert d.configuration.affects_default


def test_a_scaler_switched_by_the_hardware_only_is_left_alone():
    source = """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = crit(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    """
    assert found(source, *PRECISION) == []


# Accelerate with a --mixed_precision flag ------------------------------------------------------
ACCELERATE = """
import argparse

import torch
from accelerate import Accelerator


def parse_args():
    parser = argparse.ArgumentParser(description="Fine-tune a model")
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument(
        "--mixed_precision",
        type=str,
        default="no",
        choices=["no", "fp16", "bf16"],
        help="Whether to use mixed precision.",
    )
    return parser.parse_args()


def main():
    args = parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for batch in train_dataloader:
        with accelerator.autocast():
            loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
"""


def test_a_users_scaler_for_every_mixed_precision_flag(at):
    source = ACCELERATE.replace(
        "    for batch in train_dataloader:",
        '    scaler = torch.amp.GradScaler("cuda", enabled=args.mixed_precision != "no")\n'
        "    for batch in train_dataloader:",
    )
    assert found(source, *PRECISION) == [("ACL105", *at(source, "torch.amp.GradScaler("))]
    (d,) = lint(source, "ACL105")
    assert d.configuration.condition == "with --mixed_precision bf16 (default no)"
    assert d.severity == "warning"
    fp16_only = source.replace('!= "no"', '== "fp16"')
    assert found(fp16_only, *PRECISION) == []


def test_a_users_autocast_under_a_mixed_precision_flag(at):
    source = ACCELERATE.replace("with accelerator.autocast():", 'with torch.autocast("cuda"):')
    assert found(source, *PRECISION) == [("ACL204", *at(source, "torch.autocast("))]
    (d,) = lint(source, "ACL204")
    assert d.message.startswith(
        "autocast in fp16 (the cuda default) while `accelerator` trains in bf16 with "
        "--mixed_precision bf16 (default no):"
    )
    assert d.configuration.knobs == ("mixed_precision",)
    assert found(ACCELERATE, *PRECISION) == []
    free_form = source.replace('        choices=["no", "fp16", "bf16"],\n', "")
    assert found(free_form, *PRECISION) == []  # no choices: the precision is not known


def test_validation_inference_under_a_mixed_precision_flag_is_clean():
    source = ACCELERATE.replace(
        "def main():",
        "def log_validation(pipeline, prompts):\n"
        "    images = []\n"
        "    for prompt in prompts:\n"
        '        with torch.autocast("cuda"):\n'
        "            images.append(pipeline(prompt, num_inference_steps=25).images[0])\n"
        "    return images\n\n\n"
        "def main():",
    )
    assert found(source, *PRECISION) == []
    final = ACCELERATE.replace(
        "        optimizer.zero_grad()\n",
        "        optimizer.zero_grad()\n"
        "    for prompt in args.validation_prompts:\n"
        '        with torch.autocast("cuda"):\n'
        "            images.append(pipeline(prompt).images[0])\n",
    )
    assert "validation_prompts" in final
    assert found(final, *PRECISION) == []  # the inference after the training loop
