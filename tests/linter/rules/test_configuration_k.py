"""Findings whose verdict depends on the accumulation value K say which runs they affect: K
from a knob with default 1 is latent (reported, one level lower: a warning), a default above 1
affects the default run (the rule's own level), a literal K depends on no configuration."""

from __future__ import annotations

import textwrap

import pytest

from linter.analysis import analyze_source
from linter.types import Configuration


def lint(source: str, code: str, path: str = "train.py"):
    return analyze_source(textwrap.dedent(source), path, [code])


def latent(condition: str, *knobs: str) -> Configuration:
    return Configuration(False, condition, knobs)


def affected(condition: str, *knobs: str) -> Configuration:
    return Configuration(True, condition, knobs)


def argparse_script(default: int, body: str) -> str:
    """A script as users write one: the flags in `parse_args()`, the loop in `main()`."""
    return textwrap.dedent(
        f"""
        import argparse
        import torch

        def parse_args():
            parser = argparse.ArgumentParser()
            parser.add_argument("--gradient_accumulation_steps", type=int, default={default})
            parser.add_argument("--lr", type=float, default=1e-3)
            return parser.parse_args()

        def main():
            args = parse_args()
        """
    ) + textwrap.indent(textwrap.dedent(body), "    ")


MANUAL = """
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    if (step + 1) % args.gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
K_FLAG = "with --gradient_accumulation_steps > 1 (default {})"


@pytest.mark.parametrize(
    ("default", "severity", "expected"),
    [
        (1, "warning", latent(K_FLAG.format(1), "gradient_accumulation_steps")),
        (4, None, affected(K_FLAG.format(4), "gradient_accumulation_steps")),
    ],
)
def test_acl301_argparse_k(default, severity, expected, at):
    source = argparse_script(default, MANUAL)
    (found,) = lint(source, "ACL301")
    assert (found.code, found.start.line, found.start.column) == (
        "ACL301",
        *at(source, "loss.backward()"),
    )
    assert (found.severity, found.configuration) == (severity, expected)
    assert found.message.startswith("`loss` is backpropagated undivided")  # unchanged


def test_acl301_literal_k_depends_on_no_configuration():
    source = argparse_script(1, MANUAL.replace("args.gradient_accumulation_steps", "4"))
    (found,) = lint(source, "ACL301")
    assert (found.severity, found.configuration) == (None, None)


def test_acl301_k_through_an_alias_and_a_helper_parameter_stays_unknown():
    """`K = args.k` is the knob; a function handed K by a caller the module cannot follow
    says nothing about the configuration (no guess)."""
    body = MANUAL.replace("args.gradient_accumulation_steps", "accum")
    source = argparse_script(1, "accum = args.gradient_accumulation_steps\n" + body)
    (found,) = lint(source, "ACL301")
    assert found.configuration == latent(K_FLAG.format(1), "gradient_accumulation_steps")
    helper = "def train(loader, accum):\n" + textwrap.indent(textwrap.dedent(MANUAL), "    ")
    (found,) = lint(helper.replace("args.gradient_accumulation_steps", "accum"), "ACL301")
    assert (found.severity, found.configuration) == (None, None)


CLIP = """
from dataclasses import dataclass
import torch

@dataclass
class TrainConfig:
    grad_accum_steps: int = {default}
    max_grad_norm: float = 1.0

def train(cfg: TrainConfig):
    for i, batch in enumerate(loader):
        loss = model(**batch).loss / cfg.grad_accum_steps
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        if (i + 1) % cfg.grad_accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()

def main():
    cfg = TrainConfig()
    train(cfg)
"""


@pytest.mark.parametrize(
    ("default", "severity", "affects"), [(1, "warning", False), (4, None, True)]
)
def test_acl303_dataclass_config(default, severity, affects, at):
    source = CLIP.format(default=default)
    (found,) = lint(source, "ACL303")
    assert (found.start.line, found.start.column) == at(source, "torch.nn.utils.clip_grad_norm_")
    condition = f"with TrainConfig.grad_accum_steps > 1 (default {default})"
    assert found.configuration == Configuration(affects, condition, ("grad_accum_steps",))
    assert found.severity == severity


NANOGPT = """
import torch
learning_rate = 6e-4
gradient_accumulation_steps = {k} # used to simulate larger batch sizes
exec(open('configurator.py').read()) # overrides from command line or config file
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=600000)
iter_num = 0
while True:
    X, Y = get_batch('train')
    logits, loss = model(X, Y)
    loss = loss / gradient_accumulation_steps
    loss.backward()
    scheduler.step()
    if (iter_num + 1) % gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    iter_num += 1
"""


@pytest.mark.parametrize(("k", "shown", "affects"), [("5 * 8", 40, True), ("1", 1, False)])
def test_acl305_nanogpt_global_a_configurator_may_override(k, shown, affects, at):
    source = NANOGPT.format(k=k)
    (found,) = lint(source, "ACL305")
    assert (found.start.line, found.start.column) == at(source, "scheduler.step()")
    condition = f"with --gradient_accumulation_steps > 1 (default {shown})"
    assert found.configuration == Configuration(
        affects, condition, ("gradient_accumulation_steps",)
    )


def test_acl307_module_constant_of_one_is_still_reported_latent(at):
    """A module constant `GRAD_ACCUM = 1` is a setting a run may change: the loop is judged
    by its code (the finding stays) and the finding says the default run is not affected."""
    source = """
    import torch
    GRAD_ACCUM = 1

    def main():
        for step, (x, y) in enumerate(train_loader):
            loss = criterion(model(x), y) / GRAD_ACCUM
            loss.backward()
            if (step + 1) % GRAD_ACCUM == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    (found,) = lint(source, "ACL307")
    assert (found.start.line, found.start.column) == at(source, "(step + 1) % GRAD_ACCUM == 0")
    assert found.severity == "warning"
    assert found.configuration == latent("with GRAD_ACCUM > 1 (default 1)", "GRAD_ACCUM")


ACCELERATE = """
import argparse
import math
from accelerate import Accelerator
from transformers import get_scheduler

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gradient_accumulation_steps", type=int, default={default})
    parser.add_argument("--num_train_epochs", type=int, default=3)
    args = parser.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    train_dataloader = DataLoader(train_dataset, batch_size=8)
    max_train_steps = args.num_train_epochs * len(train_dataloader)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=max_train_steps)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
"""


@pytest.mark.parametrize(("default", "affects"), [(1, False), (8, True)])
def test_acl310_engine_k_from_a_flag(default, affects, at):
    source = ACCELERATE.format(default=default)
    (found,) = lint(source, "ACL310")
    assert (found.start.line, found.start.column) == at(source, "max_train_steps", 1)
    assert found.configuration == Configuration(
        affects, K_FLAG.format(default), ("gradient_accumulation_steps",)
    )


def test_acl311_weight_decay_scaled_by_a_flag(at):
    source = """
    import argparse
    import torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--grad_accum", type=int, default=1)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    args = parser.parse_args()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4,
                            weight_decay=args.weight_decay * args.grad_accum)
    """
    (found,) = lint(source, "ACL311")
    assert (found.start.line, found.start.column) == at(source, "args.weight_decay * args")
    assert found.configuration == latent("with --grad_accum > 1 (default 1)", "grad_accum")
    assert found.severity == "warning"


SIZED = """
import argparse
from transformers import get_linear_schedule_with_warmup

parser = argparse.ArgumentParser()
parser.add_argument("--gradient_accumulation_steps", type=int, default={default})
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

def main():
    total_steps = len(dl) * args.epochs // args.gradient_accumulation_steps
    sched = get_linear_schedule_with_warmup(opt, 100, total_steps)
    for batch in dl:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
"""


@pytest.mark.parametrize(("default", "affects"), [(1, False), (16, True)])
def test_acl313_k_configured_not_applied(default, affects, at):
    source = SIZED.format(default=default)
    (found,) = lint(source, "ACL313")
    assert (found.start.line, found.start.column) == at(source, "args.gradient_accumulation_steps")
    assert found.configuration == Configuration(
        affects, K_FLAG.format(default), ("gradient_accumulation_steps",)
    )


DDP = """
import argparse
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--accum-steps", type=int, default={default})
opt_args = parser.parse_args()

def main():
    model = DDP(net, device_ids=[rank])
    accum = opt_args.accum_steps
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
"""


@pytest.mark.parametrize(("default", "severity"), [(1, "warning"), (2, None)])
def test_acl401_ddp_with_k_from_a_flag(default, severity, at):
    source = DDP.format(default=default)
    (found,) = lint(source, "ACL401")
    assert (found.start.line, found.start.column) == at(source, "model(x)")
    assert found.severity == severity
    assert found.configuration.condition == f"with --accum-steps > 1 (default {default})"


def test_acl302_and_acl306_engine_k_from_a_flag(at):
    double = ACCELERATE.format(default=2).replace(
        "accelerator.backward(loss)",
        "accelerator.backward(loss / args.gradient_accumulation_steps)",
    )
    (found,) = lint(double, "ACL302")
    assert found.configuration == affected(K_FLAG.format(2), "gradient_accumulation_steps")
    missing = ACCELERATE.format(default=1).replace(
        "with accelerator.accumulate(model):", "if True:"
    )
    (found,) = lint(missing, "ACL306")
    assert (found.start.line, found.start.column) == at(missing, "accelerator.backward(loss)")
    assert (found.severity, found.configuration) == (
        "warning",
        latent(K_FLAG.format(1), "gradient_accumulation_steps"),
    )


def test_acl101_fp32_engine_k_from_a_flag_but_not_an_fp16_one(at):
    raw = ACCELERATE.format(default=1).replace("accelerator.backward(loss)", "loss.backward()")
    fp32 = raw.replace("Accelerator(", 'Accelerator(mixed_precision="no", ')
    (found,) = lint(fp32, "ACL101")
    assert (found.start.line, found.start.column) == at(fp32, "loss.backward()")
    assert found.configuration == latent(K_FLAG.format(1), "gradient_accumulation_steps")
    fp16 = raw.replace("Accelerator(", 'Accelerator(mixed_precision="fp16", ')
    (found,) = lint(fp16, "ACL101")
    assert (found.severity, found.configuration) == (None, None)  # fp16 unscaled: always wrong


def test_yaml_k_from_the_projects_config_file(tmp_path, at):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "train.yaml").write_text("optim:\n  lr: 0.001\naccum_steps: 8\n")
    source = textwrap.dedent(
        """
        import yaml

        with open("configs/train.yaml") as f:
            config = yaml.safe_load(f)

        for step, (x, y) in enumerate(loader):
            loss = crit(model(x), y)
            loss.backward()
            if (step + 1) % config["accum_steps"] == 0:
                opt.step()
                opt.zero_grad()
        """
    )
    (found,) = lint(source, "ACL301", str(tmp_path / "train.py"))
    assert found.configuration == affected(
        "with configs/train.yaml: accum_steps > 1 (default 8)", "accum_steps"
    )


def test_k_computed_from_module_settings_at_their_defaults(at):
    """lit-llama's `gradient_accumulation_iters = batch_size // micro_batch_size`: 16 at the
    module's settings, so the default run is affected."""
    source = """
    import torch
    batch_size = 64
    micro_batch_size = 4
    gradient_accumulation_iters = batch_size // micro_batch_size

    def train(model, optimizer, train_data):
        for iter_num in range(max_iters):
            input_ids, targets = get_batch(train_data)
            loss = loss_fn(model(input_ids), targets)
            loss.backward()
            if (iter_num + 1) % gradient_accumulation_iters == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    (found,) = lint(source, "ACL301")
    assert (found.start.line, found.start.column) == at(source, "loss.backward()")
    assert found.configuration == affected(
        "with gradient_accumulation_iters > 1 (default 16, from batch_size, micro_batch_size)",
        "batch_size",
        "micro_batch_size",
    )
    assert found.severity is None


YOLO = """
import argparse
import torch

def train(hyp, opt, device):
    epochs, batch_size = opt.epochs, opt.batch_size
    nbs = 64  # nominal batch size
    accumulate = max(round(nbs / batch_size), 1)
    last_opt_step = -1
    for epoch in range(epochs):
        for i, (imgs, targets) in enumerate(train_loader):
            ni = i + nb * epoch
            loss = compute_loss(model(imgs), targets)
            loss.backward()
            if ni - last_opt_step >= accumulate:
                optimizer.step()
                optimizer.zero_grad()
                last_opt_step = ni

def parse_opt():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default={batch}, help="total batch size")
    return parser.parse_args()

if __name__ == "__main__":
    opt = parse_opt()
    train(opt.hyp, opt, "cuda")
"""


@pytest.mark.parametrize(("batch", "default", "affects"), [(16, 4, True), (64, 1, False)])
def test_yolo_k_from_the_nominal_batch_and_a_flag(batch, default, affects, at):
    source = YOLO.replace("{batch}", str(batch))
    (found,) = lint(source, "ACL301")
    assert (found.start.line, found.start.column) == at(source, "loss.backward()")
    assert found.configuration == Configuration(
        affects, f"with accumulate > 1 (default {default}, from --batch-size)", ("batch_size",)
    )


def test_k_handed_to_a_helper_by_every_call_site(at):
    source = argparse_script(
        1,
        "train_one_epoch(model, loader, optimizer, args.gradient_accumulation_steps)\n",
    ) + textwrap.dedent(
        """
        def train_one_epoch(model, loader, optimizer, accum_iter):
            for step, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                if (step + 1) % accum_iter == 0:
                    optimizer.step()
                    optimizer.zero_grad()
        """
    )
    (found,) = lint(source, "ACL301")
    assert (found.start.line, found.start.column) == at(source, "loss.backward()")
    assert found.configuration == latent(K_FLAG.format(1), "gradient_accumulation_steps")
    other = source.replace("optimizer, args.gradient_accumulation_steps)", "optimizer, 4)")
    other += "\ntrain_one_epoch(model, loader, optimizer, args.gradient_accumulation_steps)\n"
    (found,) = lint(other, "ACL301")
    assert found.configuration is None  # one call passes a literal: the setting is not K alone


ACCELERATE_EXAMPLE = """
from accelerate import Accelerator

MAX_GPU_BATCH_SIZE = 16

def training_function(config, args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr = config["lr"]
    batch_size = int(config["batch_size"])
    # If the batch size is too big we use gradient accumulation
    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for step, batch in enumerate(train_dataloader):
        outputs = model(**batch)
        loss = outputs.loss / gradient_accumulation_steps
        accelerator.backward(loss)
        if (step + 1) % gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()

def main():
    config = {"lr": 2e-5, "num_epochs": 3, "seed": 42, "batch_size": {batch}}
    training_function(config, args)
"""


@pytest.mark.parametrize(("batch", "default", "affects"), [(16, 1, False), (64, 4, True)])
def test_k_set_in_a_branch_the_defaults_decide(batch, default, affects, at):
    """Accelerate's examples: K = 1, raised in an `if` on the configured batch size; the test
    `batch_size > MAX_GPU_BATCH_SIZE and <distributed type>` is decided by its left side when
    that is false. When it is true the platform decides, and no default is claimed."""
    source = ACCELERATE_EXAMPLE.replace("{batch}", str(batch))
    if affects:
        (found,) = lint(source, "ACL307")
        assert found.configuration is None  # `distributed_type != XLA` is no setting
        source = source.replace(" and accelerator.distributed_type != DistributedType.XLA", "")
    (found,) = lint(source, "ACL307")
    assert (found.start.line, found.start.column) == at(source, "(step + 1) %")
    condition = (
        f"with gradient_accumulation_steps > 1 (default {default}, "
        'from config["batch_size"], MAX_GPU_BATCH_SIZE)'
    )
    assert found.configuration == Configuration(
        affects, condition, ("batch_size", "MAX_GPU_BATCH_SIZE")
    )


def test_k_reassigned_in_the_loop_is_not_judged_by_a_default(at):
    """YOLO's warm-up rebinds `accumulate` inside the loop: no default value is claimed."""
    source = YOLO.replace("{batch}", "16").replace(
        "            ni = i + nb * epoch\n",
        "            ni = i + nb * epoch\n"
        "            if ni <= nw:\n"
        "                accumulate = max(1, np.interp(ni, xi, [1, nbs / batch_size]).round())\n",
    )
    (found,) = lint(source, "ACL301")
    assert (found.start.line, found.start.column) == at(source, "loss.backward()")
    assert (found.severity, found.configuration) == (None, None)


PARAMETER_K = """
import torch


def train_epoch(model, loader, optimizer, accum_grad_iters=DEFAULT):
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if (i + 1) % accum_grad_iters == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    ("default", "severity", "affects"), [(1, "warning", False), (4, None, True)]
)
def test_k_from_a_parameter_default_nobody_in_the_module_passes(default, severity, affects, at):
    """MiniGPT-4's `train_epoch(..., accum_grad_iters=1)`, called by a runner elsewhere: the
    default run sees the parameter's default."""
    source = PARAMETER_K.replace("DEFAULT", str(default))
    (found,) = lint(source, "ACL301")
    assert (found.start.line, found.start.column) == at(source, "loss.backward()")
    condition = f"with train_epoch(accum_grad_iters=...) > 1 (default {default})"
    assert found.configuration == Configuration(affects, condition, ("accum_grad_iters",))
    assert found.severity == severity  # None: the rule's own level


def test_k_parameter_passed_by_a_caller_is_not_its_default():
    """A call of the module that passes the parameter decides: a literal 4 is no knob."""
    source = PARAMETER_K.replace("DEFAULT", "1") + (
        "\n\ntrain_epoch(model, loader, optimizer, accum_grad_iters=4)\n"
    )
    (found,) = lint(source, "ACL301")
    assert found.configuration is None
