"""Facts that travel between modules of one project, each shown with two or three modules.

The layouts follow the engine / main / util families (an `engine.py` holding the epoch loop, a
`main_*.py` that builds and wraps the model, a `util/misc.py` of helpers); the code is our own.
"""

from __future__ import annotations

import pytest

# where the model is wrapped ---------------------------------------------------------------------
ENGINE = """
import math
import sys

import torch


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, update_freq):
    model.train(True)
    optimizer.zero_grad()
    for data_iter_step, (samples, targets) in enumerate(data_loader):
        samples = samples.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        output = model(samples)
        loss = criterion(output, targets)
        if not math.isfinite(loss.item()):
            sys.exit(1)
        loss /= update_freq
        loss.backward()
        if (data_iter_step + 1) % update_freq == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

MAIN = """
import argparse

import torch

from engine import train_one_epoch


def main(args):
    device = torch.device(args.device)
    model = create_model(args.model).to(device)
    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr)
    criterion = torch.nn.CrossEntropyLoss()
    for epoch in range(args.start_epoch, args.epochs):
        train_one_epoch(model, criterion, data_loader_train, optimizer, device, epoch,
                        args.update_freq)
"""


def test_ddp_wrap_in_main_reaches_the_engine_loop(tree, at):
    tree.write({"engine.py": ENGINE, "main_finetune.py": MAIN})
    engine = tree.text("engine.py")
    found = tree.diagnostics("engine.py", "ACL401")
    assert [(d.code, d.start.line, d.start.column) for d in found] == [
        ("ACL401", *at(engine, "model(samples)"))
    ]
    wrap = at(tree.text("main_finetune.py"), "model = torch.nn.parallel")[0]
    assert f"DDP model `model` (main_finetune.py:{wrap})" in found[0].message
    # linted alone, the engine does not know its model is wrapped
    assert tree.findings("engine.py", "ACL401", alone=True) == []


STARTED = """

def get_args_parser():
    parser = argparse.ArgumentParser("fine-tuning", add_help=False)
    parser.add_argument("--update_freq", default={default}, type=int)
    return parser


if __name__ == "__main__":
    args = get_args_parser()
    args = args.parse_args()
    main(args)
"""


def test_the_default_k_comes_from_the_main_that_starts_the_engine(tree, at):
    """MAE, DeiT, ConvNeXt: `main_finetune.py` parses the options in its `__main__` block and
    hands `args.update_freq` to the engine's loop; with the default 1 the wasted all-reduces of
    the engine's ACL401 are latent, with 4 the default run has them."""
    for default, affected in ((1, False), (4, True)):
        started = MAIN + STARTED.replace("{default}", str(default))
        tree.write({"engine.py": ENGINE, "main_finetune.py": started})
        (found,) = tree.diagnostics("engine.py", "ACL401")
        assert (found.start.line, found.start.column) == at(
            tree.text("engine.py"), "model(samples)"
        )
        assert found.configuration.condition == f"with --update_freq > 1 (default {default})"
        assert found.configuration.affects_default is affected
        assert tree.findings("main_finetune.py", "ACL401") == []


def test_the_main_does_not_repeat_the_engines_finding(tree, at):
    """main_finetune.py reads train_one_epoch (a loop of its own): the engine's run reports it."""
    tree.write({"engine.py": ENGINE, "main_finetune.py": MAIN})
    assert tree.findings("main_finetune.py", "ACL401") == []


def test_engine_imported_as_a_module(tree, at):
    main = MAIN.replace("from engine import train_one_epoch", "import engine").replace(
        "        train_one_epoch(", "        engine.train_one_epoch("
    )
    tree.write({"engine.py": ENGINE, "main_pretrain.py": main})
    assert tree.findings("engine.py", "ACL401") == [
        ("ACL401", *at(tree.text("engine.py"), "model(samples)"))
    ]


def test_a_main_that_never_wraps_the_model_is_not_ddp(tree, at):
    main = MAIN.replace(
        "        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])\n"
        "        model_without_ddp = model.module\n",
        "        torch.distributed.barrier()\n",
    )
    tree.write({"engine.py": ENGINE, "main.py": main})
    assert tree.findings("engine.py", "ACL401") == []


def test_package_layout_with_relative_imports(tree, at):
    main = MAIN.replace("from engine import", "from .engine import")
    tree.write({"trainer/__init__.py": "", "trainer/engine.py": ENGINE, "trainer/main.py": main})
    engine = tree.text("trainer/engine.py")
    assert tree.findings("trainer/engine.py", "ACL401") == [
        ("ACL401", *at(engine, "model(samples)"))
    ]


# a no_sync context from util/misc.py ----------------------------------------------------------
SYNC_ENGINE = """
import torch

import util.misc as misc


def train_one_epoch(model, data_loader, optimizer, epoch, args):
    model.train()
    accum_iter = args.accum_iter
    optimizer.zero_grad()
    for step, (samples, targets) in enumerate(data_loader):
        sync = (step + 1) % accum_iter == 0 or step + 1 == len(data_loader)
        with misc.ddp_sync(model, sync):
            loss = torch.nn.functional.cross_entropy(model(samples), targets)
            (loss / accum_iter).backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
"""

SYNC_MAIN = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from engine import train_one_epoch


def main(args):
    model = DDP(build_model(args).cuda(args.gpu), device_ids=[args.gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        train_one_epoch(model, data_loader_train, optimizer, epoch, args)
"""

MISC_SYNC = """
from contextlib import contextmanager

import torch


@contextmanager
def ddp_sync(module, sync):
    if sync or not isinstance(module, torch.nn.parallel.DistributedDataParallel):
        yield
    else:
        with module.no_sync():
            yield
"""

MISC_NO_SYNC = """
from contextlib import contextmanager


@contextmanager
def ddp_sync(module, sync):
    # a placeholder kept from a single-GPU version
    yield
"""


@pytest.mark.parametrize(
    "engine",
    [SYNC_ENGINE, SYNC_ENGINE.replace("import util.misc as misc", "from util import misc")],
    ids=["import-as", "from-package"],
)
def test_ddp_sync_context_from_util_misc_enters_no_sync(tree, at, engine):
    tree.write({"engine.py": engine, "main.py": SYNC_MAIN, "util/__init__.py": "",
                "util/misc.py": MISC_SYNC})  # fmt: skip
    assert tree.findings("engine.py", "ACL401") == []


def test_ddp_sync_context_that_enters_nothing(tree, at):
    tree.write({"engine.py": SYNC_ENGINE, "main.py": SYNC_MAIN, "util/__init__.py": "",
                "util/misc.py": MISC_NO_SYNC})  # fmt: skip
    engine = tree.text("engine.py")
    found = tree.diagnostics("engine.py", "ACL401")
    assert [(d.code, d.start.line, d.start.column) for d in found] == [
        ("ACL401", *at(engine, "model(samples)"))
    ]
    assert "`misc_ddp_sync`" not in found[0].message  # the file's own spelling, if named


# a clipping helper and a loss scaler in util/misc.py ----------------------------------------
CLIP_ENGINE = """
import torch

from util import misc


def train_one_epoch(model, data_loader, optimizer, loss_scaler, max_norm):
    for samples, targets in data_loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(samples), targets)
        optimizer.zero_grad(set_to_none=True)
        loss_scaler.scale(loss).backward()
        misc.clip_gradients(model.parameters(), max_norm)
        loss_scaler.step(optimizer)
        loss_scaler.update()
"""

CLIP_MISC = """
import torch


def clip_gradients(parameters, max_norm):
    if max_norm is None or max_norm <= 0:
        return None
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)


def grad_norm(parameters):
    norms = [p.grad.detach().norm(2) for p in parameters if p.grad is not None]
    return torch.stack(norms).norm(2)
"""

CLIP_MAIN = """
import torch

from engine import train_one_epoch


def main(args):
    model = build_model(args).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_scaler = torch.amp.GradScaler("cuda")
    for epoch in range(args.epochs):
        train_one_epoch(model, data_loader_train, optimizer, loss_scaler, args.clip_grad)
"""


def test_clipping_helper_of_another_module_clips_scaled_gradients(tree, at):
    tree.write({"engine.py": CLIP_ENGINE, "main.py": CLIP_MAIN, "util/__init__.py": "",
                "util/misc.py": CLIP_MISC})  # fmt: skip
    engine = tree.text("engine.py")
    found = tree.diagnostics("engine.py", "ACL104")
    assert [(d.code, d.start.line, d.start.column) for d in found] == [
        ("ACL104", *at(engine, "misc.clip_gradients"))
    ]
    assert found[0].message.startswith("`misc.clip_gradients` clips gradients")
    (edit,) = found[0].fix.edits  # the fix edits the engine, the file being linted
    assert (edit.start.line, edit.content) == (
        at(engine, "misc.clip_gradients")[0],
        "        loss_scaler.unscale_(optimizer)\n",
    )
    assert tree.findings("engine.py", "ACL104", alone=True) == []


def test_norm_helper_that_does_not_clip_is_not_a_clip(tree, at):
    engine = CLIP_ENGINE.replace(
        "misc.clip_gradients(model.parameters(), max_norm)", "misc.grad_norm(model.parameters())"
    )
    tree.write({"engine.py": engine, "main.py": CLIP_MAIN, "util/__init__.py": "",
                "util/misc.py": CLIP_MISC})  # fmt: skip
    assert tree.findings("engine.py", "ACL104") == []


def test_clipping_helper_after_unscale_is_clean(tree, at):
    engine = CLIP_ENGINE.replace(
        "        misc.clip_gradients(",
        "        loss_scaler.unscale_(optimizer)\n        misc.clip_gradients(",
    )
    tree.write({"engine.py": engine, "main.py": CLIP_MAIN, "util/__init__.py": "",
                "util/misc.py": CLIP_MISC})  # fmt: skip
    assert tree.findings("engine.py", "ACL104") == []


NATIVE_SCALER = """
import torch


class NativeScalerWithGradNormCount:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            self._scaler.unscale_(optimizer)
            if clip_grad is not None:
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()
"""

SCALER_ENGINE = """
import torch


def train_one_epoch(model, data_loader, optimizer, loss_scaler, accum_iter, clip_grad=None):
    optimizer.zero_grad()
    for step, (samples, targets) in enumerate(data_loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(samples), targets)
        loss_scaler(loss, optimizer, clip_grad=clip_grad, parameters=model.parameters(),
                    update_grad=(step + 1) % accum_iter == 0)
        if (step + 1) % accum_iter == 0:
            optimizer.zero_grad()
"""

SCALER_MAIN = """
import torch

from engine import train_one_epoch
from util.misc import NativeScalerWithGradNormCount as NativeScaler


def main(args):
    model = build_model(args).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_scaler = NativeScaler()
    for epoch in range(args.epochs):
        train_one_epoch(model, data_loader_train, optimizer, loss_scaler, args.accum_iter)
"""


def test_the_scaler_class_reaches_the_engine(tree, at):
    """The class main() builds is read into the engine's context (its `__call__` scales,
    unscales, clips and steps); what the model makes of an instance's call is its own."""
    from linter.project.context import Project

    tree.write({"engine.py": SCALER_ENGINE, "main.py": SCALER_MAIN, "util/__init__.py": "",
                "util/misc.py": NATIVE_SCALER})  # fmt: skip
    path = tree.root / "engine.py"
    context = Project(tree.root).context(str(path), path.read_text())
    assert "class NativeScaler:" in context.text
    facts = [(f["definition"], f["file"], f["line"]) for f in context.facts]
    assert ("NativeScalerWithGradNormCount", "util/misc.py", 5) in facts
    assert ("main", "main.py", at(SCALER_MAIN, "def main")[0]) in facts


def test_loss_scaler_call_is_the_backward_and_the_gated_step(tree, at):
    tree.write({"engine.py": SCALER_ENGINE.replace("(loss, optimizer", "(loss * 1.0, optimizer"),
                "main.py": SCALER_MAIN, "util/__init__.py": "",
                "util/misc.py": NATIVE_SCALER})  # fmt: skip
    engine = tree.text("engine.py")
    (found,) = tree.diagnostics("engine.py", "ACL301")
    assert (found.start.line, found.start.column) == at(engine, "loss_scaler(loss")
    assert found.message.startswith("`loss * 1.0` is backpropagated undivided")
    (edit,) = found.fix.edits  # the loss handed to the scaler is divided, in the engine
    assert edit.content == "(loss * 1.0) / accum_iter"
    assert edit.start.line == at(engine, "loss_scaler(loss")[0]
    assert tree.findings("engine.py", "ACL301", alone=True) == []


# MAE / ConvNeXt's engine: the loss divided by accum_iter before the call, the update gated
MAE_ENGINE = """
import math
import sys

import torch


def train_one_epoch(model, data_loader, optimizer, loss_scaler, accum_iter, max_norm=None):
    model.train(True)
    optimizer.zero_grad()
    for data_iter_step, (samples, targets) in enumerate(data_loader):
        with torch.cuda.amp.autocast():
            loss = torch.nn.functional.cross_entropy(model(samples), targets)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            sys.exit(1)
        loss /= accum_iter
        loss_scaler(loss, optimizer, clip_grad=max_norm, parameters=model.parameters(),
                    update_grad=(data_iter_step + 1) % accum_iter == 0)
        if (data_iter_step + 1) % accum_iter == 0:
            optimizer.zero_grad()
        torch.cuda.synchronize()
"""

STEP_CODES = ("ACL101", "ACL102", "ACL103", "ACL104", "ACL301", "ACL302", "ACL303", "ACL304",
              "ACL305", "ACL307", "ACL312")  # fmt: skip
ZEROED_EVERY_STEP = MAE_ENGINE.replace(
    "        if (data_iter_step + 1) % accum_iter == 0:\n            optimizer.zero_grad()\n", ""
).replace(
    "        loss /= accum_iter\n", "        loss /= accum_iter\n        optimizer.zero_grad()\n"
)


def _scaler_project(tree, engine: str, misc: str = NATIVE_SCALER):
    tree.write({"engine.py": engine, "main.py": SCALER_MAIN, "util/__init__.py": "",
                "util/misc.py": misc})  # fmt: skip


def test_mae_engine_through_its_loss_scaler_is_clean(tree, at):
    _scaler_project(tree, MAE_ENGINE)
    assert tree.findings("engine.py", *STEP_CODES) == []


def test_loss_scaler_call_without_update_grad_steps_every_call(tree, at):
    """update_grad left at its default True: the scaler steps on every call, no window."""
    engine = MAE_ENGINE.replace(
        ",\n                    update_grad=(data_iter_step + 1) % accum_iter == 0)", ")"
    ).replace("        loss /= accum_iter\n", "")
    _scaler_project(tree, engine)
    assert tree.findings("engine.py", *STEP_CODES) == []


def test_zero_grad_every_micro_step_wipes_the_loss_scalers_window(tree, at):
    _scaler_project(tree, ZEROED_EVERY_STEP)
    (found,) = tree.diagnostics("engine.py", *STEP_CODES)
    assert (found.code, found.start.line, found.start.column) == (
        "ACL304",
        *at(ZEROED_EVERY_STEP, "optimizer.zero_grad()", 1),
    )
    assert found.fix is None  # the step is inside the class: no line of the engine follows it
    assert tree.findings("engine.py", "ACL304", alone=True) == []


def test_a_callable_that_does_not_backpropagate_is_opaque(tree, at):
    """An instance called with the loss whose `__call__` only logs it is no backward."""
    logger = NATIVE_SCALER.replace(
        "        self._scaler.scale(loss).backward()\n", "        print(loss.item())\n"
    )
    _scaler_project(tree, MAE_ENGINE.replace("        loss /= accum_iter\n", ""), logger)
    assert tree.findings("engine.py", "ACL301", "ACL304") == []


# argparse defaults in another module -------------------------------------------------------------
TRAIN_ARGS = """
import torch

from options import get_args_parser


def main():
    args = get_args_parser().parse_args()
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step, (x, y) in enumerate(train_loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if (step + 1) % args.grad_accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""

OPTIONS = """
import argparse


def get_args_parser():
    parser = argparse.ArgumentParser("fine-tuning", add_help=False)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--grad_accum_steps", type=int, default={default},
                        help="micro-batches per optimizer step")
    return parser


def get_args():
    return get_args_parser().parse_args()
"""


@pytest.mark.parametrize("call", ["get_args_parser().parse_args()", "get_args()"])
def test_argparse_default_of_another_module_decides_the_default_run(tree, at, call):
    train = TRAIN_ARGS.replace("get_args_parser().parse_args()", call).replace(
        "import get_args_parser", f"import {call.split('(')[0]}"
    )
    for default, affected in ((1, False), (8, True)):
        tree.write({"train.py": train, "options.py": OPTIONS.replace("{default}", str(default))})
        (found,) = tree.diagnostics("train.py", "ACL301")
        assert (found.start.line, found.start.column) == at(train, "loss.backward()")
        assert found.configuration.affects_default is affected
        assert found.configuration.condition == f"with --grad_accum_steps > 1 (default {default})"
    (alone,) = tree.diagnostics("train.py", "ACL301", alone=True)
    assert alone.configuration is None  # alone, the default is out of sight


def test_a_long_argparse_function_of_another_module_is_read(tree):
    """A parser of hundreds of options (diffusers' and peft's `parse_args()` in
    `utils/args_loader.py`) is longer than other definitions may be, and still read."""
    options = [
        f'    parser.add_argument("--option_{n}", type=int, default={n})' for n in range(450)
    ]
    long_parser = OPTIONS.replace(
        '    parser.add_argument("--lr"', "\n".join(options) + '\n    parser.add_argument("--lr"'
    )
    tree.write({"train.py": TRAIN_ARGS, "options.py": long_parser.replace("{default}", "8")})
    (found,) = tree.diagnostics("train.py", "ACL301")
    assert found.configuration.condition == "with --grad_accum_steps > 1 (default 8)"
    assert found.configuration.affects_default is True


# what a loss function returns; how the collate function pads -----------------------------------
LM_TRAIN = """
import torch

from losses import token_cross_entropy


def train(model, loader, optimizer, accum_steps):
    for step, batch in enumerate(loader):
        logits = model(batch["input_ids"]).logits
        loss = token_cross_entropy(logits, batch["labels"])
        (loss / accum_steps).backward()
        if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
"""

LOSSES_MEAN = """
import torch.nn.functional as F


def token_cross_entropy(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
"""

LOSSES_POOLED = """
import torch.nn.functional as F


def token_cross_entropy(logits, labels):
    # one label per sequence: the logits are pooled over the tokens first
    return F.cross_entropy(logits.mean(dim=1), labels)
"""


def test_loss_function_of_another_module_takes_a_token_mean(tree, at):
    tree.write({"train.py": LM_TRAIN, "losses.py": LOSSES_MEAN})
    train = tree.text("train.py")
    found = tree.diagnostics("train.py", "ACL308")
    assert [(d.code, d.start.line, d.start.column) for d in found] == [
        ("ACL308", *at(train, "token_cross_entropy(logits"))
    ]
    assert found[0].message.endswith("(in losses.py:6; the change belongs there)")
    assert found[0].fix is None
    assert tree.findings("train.py", "ACL308", alone=True) == []


def test_loss_function_of_another_module_on_pooled_outputs(tree, at):
    tree.write({"train.py": LM_TRAIN, "losses.py": LOSSES_POOLED})
    assert tree.findings("train.py", "ACL308") == []


COLLATE_TRAIN = """
import torch.nn.functional as F
from torch.utils.data import DataLoader

from data import collate_batch


def train(model, dataset, optimizer, accum_steps):
    loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=collate_batch)
    for step, (input_ids, labels) in enumerate(loader):
        logits = model(input_ids)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        (loss / accum_steps).backward()
        if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
"""

COLLATE_PADDED = """
import torch
from torch.nn.utils.rnn import pad_sequence


def collate_batch(examples):
    input_ids = pad_sequence([e["input_ids"] for e in examples], batch_first=True)
    labels = pad_sequence([e["labels"] for e in examples], batch_first=True, padding_value=-100)
    return input_ids, labels
"""

COLLATE_FIXED = """
import torch


def collate_batch(examples):
    input_ids = torch.stack([e["input_ids"] for e in examples])
    labels = torch.stack([e["labels"] for e in examples])
    return input_ids, labels
"""


def test_collate_of_another_module_pads_labels_with_minus_100(tree, at):
    tree.write({"train.py": COLLATE_TRAIN, "data.py": COLLATE_PADDED})
    train = tree.text("train.py")
    assert tree.findings("train.py", "ACL308") == [("ACL308", *at(train, "F.cross_entropy"))]
    assert tree.findings("train.py", "ACL308", alone=True) == []


def test_collate_of_another_module_stacks_equal_lengths(tree, at):
    tree.write({"train.py": COLLATE_TRAIN, "data.py": COLLATE_FIXED})
    assert tree.findings("train.py", "ACL308") == []


# a helper that reaches further out stays what it was: an opaque call ------------------------------
TOKEN_TRAIN = """
import torch

from mylib import training


def train(model, loader, optimizer, loss_fn, accum_steps):
    num_tokens = 0
    for step, batch in enumerate(loader):
        tokens = (batch["labels"] != loss_fn.ignore_index).sum()
        num_tokens += tokens
        loss = loss_fn(model(batch["input_ids"]), batch["labels"]) * tokens
        loss.backward()
        if (step + 1) % accum_steps == 0:
            training.scale_grads_(model.parameters(), 1.0 / num_tokens)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            num_tokens = 0
"""

GRADS = """
import torch


def scale_grads_(parameters, scaler):
    parameters = list(parameters)
    _multiply_grads(parameters, scaler)


def _multiply_grads(parameters, scaler):
    grads = [p.grad for p in parameters if p.grad is not None]
    torch._foreach_mul_(grads, scaler.to(grads[0].device))
"""


def test_gradient_scaling_helper_reexported_by_a_package_stays_opaque(tree, at):
    tree.write({"train.py": TOKEN_TRAIN, "mylib/__init__.py": "",
                "mylib/training/__init__.py": "from mylib.training._grads import scale_grads_\n",
                "mylib/training/_grads.py": GRADS})  # fmt: skip
    assert tree.findings("train.py", "ACL301") == []
    assert tree.findings("train.py", "ACL301", alone=True) == []
    unscaled = TOKEN_TRAIN.replace(
        "            training.scale_grads_(model.parameters(), 1.0 / num_tokens)\n", ""
    )
    tree.write({"train.py": unscaled})
    assert tree.findings("train.py", "ACL301") == [("ACL301", *at(unscaled, "loss.backward()"))]


def test_clipping_helper_reexported_by_the_package(tree, at):
    engine = CLIP_ENGINE.replace("from util import misc", "from util import clip_gradients")
    engine = engine.replace("misc.clip_gradients(", "clip_gradients(")
    tree.write({"engine.py": engine, "main.py": CLIP_MAIN,
                "util/__init__.py": "from .misc import clip_gradients, grad_norm\n",
                "util/misc.py": CLIP_MISC})  # fmt: skip
    assert tree.findings("engine.py", "ACL104") == [("ACL104", *at(engine, "clip_gradients("))]


# a step split over plain functions of util/steps.py that take the scaler and the optimizer -------
STEPS = """
import torch


def backward_step(scaler, loss):
    scaler.scale(loss).backward()


def update(scaler, optimizer, model, max_norm):
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
"""

STEPS_ENGINE = """
import torch
import torch.nn.functional as F

from util.steps import backward_step, update


def train_one_epoch(model, loader, optimizer, scaler, accum_steps, max_norm):
    optimizer.zero_grad()
    for step, (images, targets) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(images), targets)
        backward_step(scaler, loss / accum_steps)
        if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
            update(scaler, optimizer, model, max_norm)
"""

STEPS_MAIN = """
import torch

from engine import train_one_epoch


def main(args):
    model = build_model().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(90):
        train_one_epoch(model, train_loader, optimizer, scaler, args.accum_steps, 1.0)
"""


def _steps_project(tree, engine: str = STEPS_ENGINE, steps: str = STEPS):
    tree.write({"engine.py": engine, "main.py": STEPS_MAIN, "util/__init__.py": "",
                "util/steps.py": steps})  # fmt: skip


def test_step_split_over_helpers_of_another_module_is_clean(tree, at):
    _steps_project(tree)
    assert tree.findings("engine.py", *STEP_CODES) == []


def test_backward_helper_of_another_module_handed_an_undivided_loss(tree, at):
    engine = STEPS_ENGINE.replace(
        "backward_step(scaler, loss / accum_steps)", "backward_step(scaler, loss)"
    )
    _steps_project(tree, engine)
    (found,) = tree.diagnostics("engine.py", *STEP_CODES)
    assert (found.code, found.start.line, found.start.column) == (
        "ACL301",
        *at(engine, "backward_step(scaler, loss)"),
    )
    backward = at(STEPS, "scaler.scale(loss).backward()")[0]
    assert found.message.endswith(f"(in util/steps.py:{backward}; the change belongs there)")
    assert found.fix is None
    assert tree.findings("engine.py", *STEP_CODES, alone=True) == []


def test_update_helper_of_another_module_clips_before_it_unscales(tree, at):
    _steps_project(tree, steps=STEPS.replace("    scaler.unscale_(optimizer)\n", ""))
    call = "update(scaler, optimizer, model, max_norm)"
    (found,) = tree.diagnostics("engine.py", *STEP_CODES)
    assert (found.code, found.start.line, found.start.column) == ("ACL104", *at(STEPS_ENGINE, call))
    (edit,) = found.fix.edits  # the engine unscales before handing over: its own line
    assert (edit.start.line, edit.content) == (
        at(STEPS_ENGINE, call)[0],
        "            scaler.unscale_(optimizer)\n",
    )


def test_zero_grad_every_micro_step_around_helpers_of_another_module(tree, at):
    engine = STEPS_ENGINE.replace(
        "        backward_step(", "        optimizer.zero_grad()\n        backward_step("
    )
    _steps_project(tree, engine)
    assert tree.findings("engine.py", *STEP_CODES) == [
        ("ACL304", *at(engine, "optimizer.zero_grad()", 1))
    ]
    assert tree.findings("engine.py", "ACL304", alone=True) == []


def test_loss_scaler_class_clipping_before_it_unscales_is_its_modules_finding(tree, at):
    """The class's own protocol is judged where it is written; the engine calling it does
    not repeat it."""
    misc = NATIVE_SCALER.replace("            self._scaler.unscale_(optimizer)\n", "")
    _scaler_project(tree, MAE_ENGINE, misc)
    clip = "torch.nn.utils.clip_grad_norm_(parameters, clip_grad)"
    assert tree.findings("util/misc.py", "ACL104") == [("ACL104", *at(misc, clip))]
    assert tree.findings("engine.py", *STEP_CODES) == []


# a GradScaler built by a helper of another module -----------------------------------------------
SCALER_UTILS = """
import torch


def get_grad_scaler(**kwargs):
    if torch.cuda.is_available():
        return torch.amp.GradScaler("cuda", **kwargs)
    return torch.amp.GradScaler("cpu", **kwargs)
"""

BF16_TRAIN = """
import torch

from utils import get_grad_scaler


def train(model, loader, optimizer):
    scaler = get_grad_scaler()
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""


def test_scaler_from_a_helper_of_another_module_under_bf16(tree, at):
    """Reported at the caller's line, which is the one to change: the helper is generic."""
    tree.write({"utils.py": SCALER_UTILS, "train.py": BF16_TRAIN})
    train = tree.text("train.py")
    (found,) = tree.diagnostics("train.py", "ACL105")
    assert (found.start.line, found.start.column) == at(train, "get_grad_scaler()")
    assert "it is built by `get_grad_scaler()`, so remove it by hand" in found.message
    assert "the change belongs there" not in found.message
    assert tree.findings("train.py", "ACL105", alone=True) == []


def test_scaler_from_a_helper_of_another_module_under_fp16_is_not_flagged(tree):
    tree.write({"utils.py": SCALER_UTILS, "train.py": BF16_TRAIN.replace("bfloat16", "float16")})
    assert tree.findings("train.py", "ACL105", "ACL102", "ACL103", "ACL104") == []
