"""Issue 23, within a file: a training step spread over a trainer's methods, helpers called
with the caller's objects, and context managers the module defines. Each bug is asserted at its
exact place; each correct version asserts `== []`."""

from __future__ import annotations

TRAINER = """
import torch
from torch.amp import GradScaler, autocast


class Trainer:
    def __init__(self, model, cfg):
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.scaler = GradScaler("cuda")
        self.accum_steps = cfg.grad_accum_steps
        self.micro_step = 0

    def backward(self, loss):
        self.scaler.scale(loss / self.accum_steps).backward()

    def optimizer_step(self):
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, batch):
        with autocast("cuda"):
            loss = self.model(batch["input_ids"], labels=batch["labels"]).loss
        self.backward(loss)
        self.micro_step += 1
        if self.micro_step % self.accum_steps == 0:
            self.optimizer_step()

    def fit(self, loader):
        for batch in loader:
            self.train_step(batch)
"""

UNDIVIDED = TRAINER.replace("scale(loss / self.accum_steps)", "scale(loss)")


def _all_codes(source: str) -> list[tuple[str, int, int]]:
    """Every finding of the rules this file is about (ACL203's import advice aside)."""
    import textwrap

    from linter.analysis import analyze_source

    codes = ["ACL101", "ACL102", "ACL103", "ACL104", "ACL106", "ACL201", "ACL202"]
    codes += ["ACL301", "ACL302", "ACL303", "ACL304", "ACL305", "ACL401"]
    found = analyze_source(textwrap.dedent(source), "snippet.py", codes)
    return [(d.code, d.start.line, d.start.column) for d in found]


# a trainer class ------------------------------------------------------------------------------
def test_trainer_split_into_methods_is_one_correct_step():
    assert _all_codes(TRAINER) == []


def test_trainer_backward_method_undivided(acl301, at):
    assert acl301.findings(UNDIVIDED) == [
        ("ACL301", *at(UNDIVIDED, "self.scaler.scale(loss).backward()"))
    ]
    fixed = acl301.fixed(UNDIVIDED)
    assert "        loss = loss / self.accum_steps\n        self.scaler.scale(loss)" in fixed


def test_trainer_counter_reset_in_another_method(acl301, at):
    """`self.micro_step` counts the window in `train_step` and is reset where the optimizer
    steps: a counter gate (`>=`) on an attribute of the class."""
    source = UNDIVIDED.replace(
        "        self.optimizer.zero_grad(set_to_none=True)\n",
        "        self.optimizer.zero_grad(set_to_none=True)\n        self.micro_step = 0\n",
    ).replace("self.micro_step % self.accum_steps == 0", "self.micro_step >= self.accum_steps")
    assert acl301.findings(source) == [
        ("ACL301", *at(source, "self.scaler.scale(loss).backward()"))
    ]
    divided = source.replace("scale(loss)", "scale(loss / self.accum_steps)")
    assert _all_codes(divided) == []


def test_trainer_loss_divided_in_train_step_is_not_flagged(acl301):
    source = UNDIVIDED.replace(
        ".loss\n        self.backward(loss)",
        ".loss\n        loss = loss / self.accum_steps\n        self.backward(loss)",
    )
    assert acl301.findings(source) == []


def test_trainer_clips_every_micro_step(acl303, at):
    source = TRAINER.replace(
        "        self.scaler.unscale_(self.optimizer)\n"
        "        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n",
        "",
    ).replace(
        "        self.backward(loss)\n",
        "        self.backward(loss)\n        self.scaler.unscale_(self.optimizer)\n"
        "        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n",
    )
    # the unscale and the clip: one misplaced block, one finding at its first line
    assert acl303.findings(source) == [
        ("ACL303", *at(source, "self.scaler.unscale_(self.optimizer)"))
    ]


def test_trainer_scheduler_stepped_every_micro_step(acl305, at):
    source = TRAINER.replace(
        '        self.scaler = GradScaler("cuda")\n',
        '        self.scaler = GradScaler("cuda")\n'
        "        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(\n"
        "            self.optimizer, T_max=cfg.total_steps\n        )\n",
    )
    gated = source.replace(
        "            self.optimizer_step()\n",
        "            self.optimizer_step()\n            self.scheduler.step()\n",
    )
    ungated = source.replace(
        "            self.optimizer_step()\n",
        "            self.optimizer_step()\n        self.scheduler.step()\n",
    )
    # gated: only the hint that a skipped GradScaler step still advances the schedule, as for
    # `scaler.update(); sched.step()` written inline
    hints = [(d.severity, d.start.line) for d in acl305.diagnostics(gated)]
    assert hints == [("info", at(gated, "self.scheduler.step()")[0])]
    assert acl305.findings(ungated) == [("ACL305", *at(ungated, "self.scheduler.step()"))]


def test_trainer_clips_before_unscaling(acl104, at):
    source = TRAINER.replace("        self.scaler.unscale_(self.optimizer)\n", "")
    assert acl104.findings(source) == [
        ("ACL104", *at(source, "torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)"))
    ]


def test_trainer_backward_method_skips_the_scaler_its_class_steps(acl101, at):
    source = TRAINER.replace(
        "self.scaler.scale(loss / self.accum_steps).backward()",
        "(loss / self.accum_steps).backward()",
    )
    assert acl101.findings(source) == [
        ("ACL101", *at(source, "(loss / self.accum_steps).backward()"))
    ]
    assert acl101.findings(TRAINER) == []


def test_trainer_steps_the_optimizer_past_its_scaler(acl102, at):
    source = TRAINER.replace(
        "        self.scaler.step(self.optimizer)\n", "        self.optimizer.step()\n"
    )
    assert acl102.findings(source) == [("ACL102", *at(source, "self.optimizer.step()"))]


def test_trainer_never_updates_its_scaler(acl103, at):
    source = TRAINER.replace("        self.scaler.update()\n", "")
    assert acl103.findings(source) == [("ACL103", *at(source, "self.scaler.step(self.optimizer)"))]


# a helper called from main() with the real objects ---------------------------------------------
HELPER = """
import argparse

import torch
import torch.nn.functional as F


def train_one_epoch(model, loader, optimizer, scaler, accum_steps):
    model.train()
    for step, (images, targets) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(images), targets)
        scaler.scale(loss).backward()
        if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grad-accum-steps", type=int, default=4)
    args = parser.parse_args()
    model = build_model().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(90):
        train_one_epoch(model, train_loader, optimizer, scaler, args.grad_accum_steps)
"""


def test_helper_called_from_main_undivided(acl301, at):
    assert acl301.findings(HELPER) == [("ACL301", *at(HELPER, "scaler.scale(loss).backward()"))]
    assert "        loss = loss / accum_steps\n" in acl301.fixed(HELPER)


def test_helper_called_from_main_divided_is_not_flagged():
    source = HELPER.replace("scaler.scale(loss)", "scaler.scale(loss / accum_steps)")
    assert _all_codes(source) == []


def test_helper_given_the_k_of_a_dataclass_or_a_namespace(acl301, at):
    dataclass_config = (
        HELPER.replace(
            "def main():\n",
            "@dataclass\nclass TrainConfig:\n    grad_accum_steps: int = 8\n\n\ndef main():\n",
        )
        .replace("import argparse\n", "import argparse\nfrom dataclasses import dataclass\n")
        .replace("args.grad_accum_steps", "TrainConfig().grad_accum_steps")
    )
    namespace = (
        HELPER.replace(
            "    args = parser.parse_args()\n",
            "    args = parser.parse_args()\n"
            "    cfg = SimpleNamespace(accum=args.grad_accum_steps)\n",
        )
        .replace("import argparse\n", "import argparse\nfrom types import SimpleNamespace\n")
        .replace("scaler, args.grad_accum_steps)", "scaler, accum_steps=cfg.accum)")
    )
    for source in (dataclass_config, namespace):
        assert acl301.findings(source) == [
            ("ACL301", *at(source, "scaler.scale(loss).backward()"))
        ], source


def test_helper_handed_a_disabled_scaler_clips_without_unscale(acl104):
    """The scaler main() builds is disabled: what the helper clips is not scaled."""
    source = HELPER.replace(
        'scaler = torch.amp.GradScaler("cuda")',
        'scaler = torch.amp.GradScaler("cuda", enabled=False)',
    ).replace("            scaler.unscale_(optimizer)\n", "")
    assert acl104.findings(source) == []
    enabled = HELPER.replace("            scaler.unscale_(optimizer)\n", "")
    assert [f[0] for f in acl104.findings(enabled)] == ["ACL104"]


# context managers the module defines --------------------------------------------------------------
DDP_TRAINER = """
import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


@contextlib.contextmanager
def maybe_no_sync(model, sync):
    if sync:
        yield
    else:
        with model.no_sync():
            yield


class Trainer:
    def __init__(self, model, cfg, local_rank):
        self.model = DDP(model.cuda(local_rank), device_ids=[local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.accum_steps = cfg.grad_accum_steps

    def train_epoch(self, loader):
        for step, (x, y) in enumerate(loader):
            sync = (step + 1) % self.accum_steps == 0
            with maybe_no_sync(self.model, sync):
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
                (loss / self.accum_steps).backward()
            if sync:
                self.optimizer.step()
                self.optimizer.zero_grad()
"""


def test_context_manager_entering_no_sync_unless_sync(acl401):
    assert acl401.findings(DDP_TRAINER) == []


def test_without_the_context_manager_the_ddp_trainer_syncs_every_micro_step(acl401, at):
    source = DDP_TRAINER.replace(
        "            with maybe_no_sync(self.model, sync):\n"
        "                loss = torch.nn.functional.cross_entropy(self.model(x), y)\n"
        "                (loss / self.accum_steps).backward()\n",
        "            loss = torch.nn.functional.cross_entropy(self.model(x), y)\n"
        "            (loss / self.accum_steps).backward()\n",
    )
    assert acl401.findings(source) == [("ACL401", *at(source, "self.model(x)"))]


AUTOCAST_CLASS = """
import torch


class MixedPrecision:
    def __init__(self, enabled=True):
        self.enabled = enabled
        self._ctx = None

    def __enter__(self):
        self._ctx = torch.autocast("cuda", dtype=torch.float16, enabled=self.enabled)
        return self._ctx.__enter__()

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def train(model, loader, optimizer, scaler):
    for x, y in loader:
        with MixedPrecision():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""


def test_context_manager_class_entering_autocast_is_a_correct_amp_step():
    assert _all_codes(AUTOCAST_CLASS) == []


def test_backward_inside_a_context_manager_class_that_enters_autocast(acl202, at):
    source = AUTOCAST_CLASS.replace(
        "            loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        scaler.scale(loss).backward()\n",
        "            loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "            scaler.scale(loss).backward()\n",
    )
    assert acl202.findings(source) == [("ACL202", *at(source, "scaler.scale(loss).backward()"))]


def test_ddp_trainer_split_into_methods_syncs_every_micro_step(acl401, at):
    """The forward runs in `train_step`, the backward in the `backward` method it calls: the
    micro-step to put under `no_sync()` is the forward and that call."""
    source = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Trainer:
        def __init__(self, model, cfg, local_rank):
            self.model = DDP(model.cuda(local_rank), device_ids=[local_rank])
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
            self.accum_steps = cfg.grad_accum_steps
            self.micro_step = 0

        def backward(self, loss):
            (loss / self.accum_steps).backward()

        def optimizer_step(self):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

        def train_step(self, x, y):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.backward(loss)
            self.micro_step += 1
            if self.micro_step % self.accum_steps == 0:
                self.optimizer_step()

        def fit(self, loader):
            for x, y in loader:
                self.train_step(x, y)
    """
    assert acl401.findings(source) == [("ACL401", *at(source, "self.model(x)"))]


# a loss scaler class called by its instance, in the same file ------------------------------------
SCALER_CLASS = """
import torch


class NativeScaler:
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


def train_one_epoch(model, loader, optimizer, loss_scaler, accum_iter):
    optimizer.zero_grad()
    for step, (x, y) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss /= accum_iter
        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters(),
                    update_grad=(step + 1) % accum_iter == 0)
        if (step + 1) % accum_iter == 0:
            optimizer.zero_grad()


def main(args):
    model = build_model().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_scaler = NativeScaler()
    for epoch in range(args.epochs):
        train_one_epoch(model, train_loader, optimizer, loss_scaler, args.accum_iter)
"""


def test_loss_scaler_class_of_the_same_file_is_a_correct_step():
    assert _all_codes(SCALER_CLASS) == []


def test_loss_scaler_class_of_the_same_file_handed_an_undivided_loss(acl301, at):
    source = SCALER_CLASS.replace("        loss /= accum_iter\n", "")
    assert acl301.findings(source) == [("ACL301", *at(source, "loss_scaler(loss"))]
    assert "        loss = loss / accum_iter\n        loss_scaler(loss" in acl301.fixed(source)


def test_loss_scaler_class_clipping_before_it_unscales(acl104, at):
    """Said once, in the class (the change is there), not again at each call."""
    source = SCALER_CLASS.replace("            self._scaler.unscale_(optimizer)\n", "")
    clip = "torch.nn.utils.clip_grad_norm_(parameters, clip_grad)"
    assert acl104.findings(source) == [("ACL104", *at(source, clip))]
    assert "        self._scaler.unscale_(optimizer)\n                " in acl104.fixed(source)


def test_zero_grad_every_micro_step_before_the_loss_scaler_call(acl304, at):
    source = SCALER_CLASS.replace(
        "        if (step + 1) % accum_iter == 0:\n            optimizer.zero_grad()\n", ""
    ).replace(
        "        loss /= accum_iter\n",
        "        loss /= accum_iter\n        optimizer.zero_grad()\n",
    )
    (found,) = acl304.diagnostics(source)
    assert (found.start.line, found.start.column) == at(source, "optimizer.zero_grad()", 1)
    assert found.fix is None  # after the class's step is no line of this loop
    assert _all_codes(source) == [("ACL304", *at(source, "optimizer.zero_grad()", 1))]


# a step split over module functions that take the scaler and the optimizer --------------------
SPLIT_STEP = """
import torch
import torch.nn.functional as F


def backward_step(scaler, loss):
    scaler.scale(loss).backward()


def update(scaler, optimizer, model, max_norm):
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def train_one_epoch(model, loader, optimizer, scaler, accum_steps, max_norm):
    for step, (images, targets) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(images), targets)
        backward_step(scaler, loss / accum_steps)
        if (step + 1) % accum_steps == 0:
            update(scaler, optimizer, model, max_norm)


def main(args):
    model = build_model().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(90):
        train_one_epoch(model, train_loader, optimizer, scaler, args.accum_steps, 1.0)
"""


def test_step_split_over_module_functions_is_a_correct_step():
    assert _all_codes(SPLIT_STEP) == []


def test_update_helper_that_clips_before_it_unscales(acl104, at):
    """The helper clips what the caller's backward scaled: the call is what clips, and
    unscaling the optimizer the call hands it, before the call, is the fix (its
    `scaler.step` then does not unscale again)."""
    source = SPLIT_STEP.replace("    scaler.unscale_(optimizer)\n", "")
    call = "update(scaler, optimizer, model, max_norm)"
    (found,) = acl104.diagnostics(source)
    assert (found.start.line, found.start.column) == at(source, call, 1)
    assert found.message.startswith("`update` clips gradients that `scaler.scale(...)`")
    assert f"            scaler.unscale_(optimizer)\n            {call}" in acl104.fixed(source)
    assert acl104.findings(SPLIT_STEP) == []


def test_update_helper_handed_other_names(acl104, at):
    """The fix names the optimizer as the caller passes it, not as the helper calls it."""
    source = (
        SPLIT_STEP.replace("    scaler.unscale_(optimizer)\n", "")
        .replace(
            "def update(scaler, optimizer, model, max_norm):",
            "def update(s, opt, model, max_norm):",
        )
        .replace(
            "    scaler.step(optimizer)\n    scaler.update()\n", "    s.step(opt)\n    s.update()\n"
        )
        .replace(
            "    optimizer.zero_grad(set_to_none=True)\n", "    opt.zero_grad(set_to_none=True)\n"
        )
    )
    fixed = acl104.fixed(source)
    assert "            scaler.unscale_(optimizer)\n            update(scaler, optimizer," in fixed


def test_split_step_handed_an_undivided_loss(acl301, at):
    source = SPLIT_STEP.replace(
        "backward_step(scaler, loss / accum_steps)", "backward_step(scaler, loss)"
    )
    assert acl301.findings(source) == [("ACL301", *at(source, "scaler.scale(loss).backward()"))]


def test_zero_grad_every_micro_step_around_the_split_step(acl304, at):
    """The loop calling `backward_step` is the window: its ungated zero_grad wipes it."""
    source = SPLIT_STEP.replace(
        "        backward_step(", "        optimizer.zero_grad()\n        backward_step("
    )
    assert acl304.findings(source) == [("ACL304", *at(source, "optimizer.zero_grad()"))]
    assert _all_codes(source) == [("ACL304", *at(source, "optimizer.zero_grad()"))]


def test_scheduler_stepped_every_micro_step_beside_the_loss_scaler_call(acl305, at):
    source = SCALER_CLASS.replace(
        "def train_one_epoch(model, loader, optimizer, loss_scaler, accum_iter):",
        "def train_one_epoch(model, loader, optimizer, loss_scaler, accum_iter, lr_scheduler):",
    ).replace(
        "        if (step + 1) % accum_iter == 0:\n            optimizer.zero_grad()\n",
        "        lr_scheduler.step()\n        if (step + 1) % accum_iter == 0:\n"
        "            optimizer.zero_grad()\n",
    )
    assert acl305.findings(source) == [("ACL305", *at(source, "lr_scheduler.step()"))]


def test_ddp_model_syncs_every_loss_scaler_call(acl401, at):
    """The call is the backward: under `no_sync()` except on the step its update_grad passes."""
    source = SCALER_CLASS.replace(
        "    model = build_model().cuda()\n",
        "    model = torch.nn.parallel.DistributedDataParallel(build_model().cuda())\n",
    )
    assert acl401.findings(source) == [("ACL401", *at(source, "model(x)"))]
    fixed = acl401.fixed(source, unsafe=True)
    assert (
        "        with nullcontext() if (step + 1) % accum_iter == 0 else model.no_sync():\n"
        in fixed
    )
    assert "            loss_scaler(loss, optimizer" in fixed
    assert acl401.findings(SCALER_CLASS) == []


# objects a module helper builds and returns ----------------------------------------------------
SCALER_HELPER = """
import torch


def get_grad_scaler():
    return torch.amp.GradScaler("cuda")


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


def test_scaler_returned_by_a_helper_under_bf16(acl105, at):
    bound_then_returned = SCALER_HELPER.replace(
        '    return torch.amp.GradScaler("cuda")\n',
        '    scaler = torch.amp.GradScaler("cuda")\n    return scaler\n',
    )
    for source in (SCALER_HELPER, bound_then_returned):
        (diagnostic,) = acl105.diagnostics(source)
        # at the caller's line that takes the scaler: the helper may serve other callers
        where = at(source, "get_grad_scaler()", nth=1)
        assert (diagnostic.start.line, diagnostic.start.column) == where
        assert "it is built by `get_grad_scaler()`, so remove it by hand" in diagnostic.message
        assert diagnostic.fix is None


def test_scaler_returned_by_a_helper_under_fp16_is_not_flagged():
    assert _all_codes(SCALER_HELPER.replace("torch.bfloat16", "torch.float16")) == []


LOADER_HELPER = """
import torch
from torch.utils.data import DataLoader, DistributedSampler


def build_loader(dataset, batch_size):
    sampler = DistributedSampler(dataset, shuffle=True)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


def main(dataset, model, optimizer, epochs=10):
    loader = build_loader(dataset, 32)
    for epoch in range(epochs):
        SET_EPOCH
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""


def test_loader_returned_by_a_helper_is_never_told_the_epoch(acl404, at):
    source = LOADER_HELPER.replace("        SET_EPOCH\n", "")
    bound_then_returned = source.replace(
        "    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)\n",
        "    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)\n"
        "    return loader\n",
    )
    for text in (source, bound_then_returned):
        (diagnostic,) = acl404.diagnostics(text)
        assert (diagnostic.start.line, diagnostic.start.column) == at(text, "for epoch")
        # the helper's local `sampler` is not visible in main: name it through the loader
        assert diagnostic.notes == (
            "call `loader.sampler.set_epoch(epoch)` at the start of each epoch",
        )


def test_loader_returned_by_a_helper_told_the_epoch_is_not_flagged(acl404):
    source = LOADER_HELPER.replace("SET_EPOCH", "loader.sampler.set_epoch(epoch)")
    assert acl404.findings(source) == []


ACCELERATOR_HELPER = """
from accelerate import Accelerator


def build_accelerator():
    return Accelerator(mixed_precision="fp16", gradient_accumulation_steps=4)


def main(model, optimizer, loader):
    accelerator = build_accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_accelerator_returned_by_a_helper_without_accumulate(acl101, acl306, at):
    """Two causes, one finding each: the raw backward skips the fp16 scaling (ACL101), and no
    window is ever counted (ACL306). With no window the raw backward misses no division, so
    ACL101 does not claim one, and its fix alone would make every update 4 times smaller:
    unsafe. Both fixes together give the accumulate loop."""
    where = at(ACCELERATOR_HELPER, "loss.backward()")
    (raw,) = acl101.diagnostics(ACCELERATOR_HELPER)
    assert (raw.start.line, raw.start.column) == where
    assert raw.message.endswith(": the fp16 loss is never scaled")
    assert raw.fix is not None and raw.fix.applicability == "unsafe"
    (missing,) = acl306.diagnostics(ACCELERATOR_HELPER)
    assert (missing.start.line, missing.start.column) == where
    assert missing.message.endswith(
        ": the optimizer steps on every batch, so the 4-step accumulation never happens"
    )


def test_accelerator_returned_by_a_helper_with_accumulate(acl101):
    source = ACCELERATOR_HELPER.replace(
        "        loss = model(**batch).loss\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n",
        "        with accelerator.accumulate(model):\n"
        "            loss = model(**batch).loss\n"
        "            loss.backward()\n"
        "            optimizer.step()\n"
        "            optimizer.zero_grad()\n",
    )
    (raw,) = acl101.diagnostics(source)
    assert "the gradients of the 4 accumulation steps are summed" in raw.message
    assert raw.fix is not None and raw.fix.applicability == "safe"
    assert "            accelerator.backward(loss)\n" in acl101.fixed(source)
    fixed = acl101.fixed(source)
    assert _all_codes(fixed) == []
