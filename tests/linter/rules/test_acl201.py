"""ACL201 double-autocast: user autocast around a low-precision prepared model, or nested."""

from __future__ import annotations

import textwrap

PREPARED = """
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16")
model, opt, dl = accelerator.prepare(model, opt, dl)
for x in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = info_nce(model(x), temperature=0.05)
    accelerator.backward(loss)
    opt.step()
"""


def test_region_around_prepared_model_is_flagged_and_fixed(acl201, at):
    assert acl201.findings(PREPARED) == [("ACL201", *at(PREPARED, "torch.autocast("))]
    (diagnostic,) = acl201.diagnostics(PREPARED)
    assert diagnostic.fix.applicability == "unsafe"
    assert acl201.fixed(PREPARED) == textwrap.dedent(PREPARED)  # unsafe: not applied by default
    assert acl201.fixed(PREPARED, unsafe=True) == textwrap.dedent(PREPARED).replace(
        'torch.autocast("cuda", dtype=torch.float16)', "accelerator.autocast()"
    )


def test_aliased_cuda_amp_autocast_in_trainer_method(acl201, at):
    source = """
    from accelerate import Accelerator
    from torch.cuda.amp import autocast as ac

    class Trainer:
        def __init__(self, model, opt):
            self.accelerator = Accelerator(mixed_precision="bf16")
            self.model, self.opt = self.accelerator.prepare(model, opt)

        def fit(self, dl):
            for x in dl:
                with ac():
                    loss = self.model(x).pow(2).mean()
                self.accelerator.backward(loss)
                self.opt.step()
    """
    assert acl201.findings(source) == [("ACL201", *at(source, "ac()"))]
    assert "with self.accelerator.autocast():" in acl201.fixed(source, unsafe=True)


def test_context_bound_to_a_name_nanogpt_style(acl201, at):
    source = """
    from contextlib import nullcontext

    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, opt = accelerator.prepare(model, opt)
    ctx = nullcontext() if device == "cpu" else torch.amp.autocast("cuda", dtype=torch.bfloat16)
    for x in dl:
        with ctx:
            loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
    """
    (diagnostic,) = acl201.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "ctx:")
    assert diagnostic.fix is None  # the call is bound elsewhere: nothing to rewrite in place
    plain = source.replace('nullcontext() if device == "cpu" else ', "nullcontext()  # ")
    assert acl201.findings(plain) == []


def test_nested_user_regions(acl201, at):
    source = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            with torch.amp.autocast("cuda", dtype=torch.float16):
                # the head
                loss = crit(head(out), y)
            loss.backward()
        opt.step()
    """
    assert acl201.findings(source) == [("ACL201", *at(source, "torch.amp.autocast("))]
    expected = (
        "        out = model(x)\n"
        "        # the head\n"
        "        loss = crit(head(out), y)\n"
        "        loss.backward()\n"
    )
    assert expected in acl201.fixed(source, unsafe=True)


# --- must not flag ----------------------------------------------------------------------------


def test_inner_region_disabled_is_an_fp32_island(acl201):
    source = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            with torch.autocast("cuda", enabled=False):
                loss = crit(out.float(), y)
        loss.backward()
        opt.step()
    """
    assert acl201.findings(source) == []


def test_engine_autocast_around_loss_code(acl201):
    source = PREPARED.replace(
        'torch.autocast("cuda", dtype=torch.float16)', "accelerator.autocast()"
    )
    assert acl201.findings(source) == []


def test_autocast_around_a_model_never_prepared(acl201):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    student, opt = accelerator.prepare(student, opt)
    teacher = load_teacher()
    for x in dl:
        with torch.no_grad(), torch.autocast("cuda"):
            target = teacher(x)
        loss = mse(student(x), target)
        accelerator.backward(loss)
        opt.step()
    """
    assert acl201.findings(source) == []


def test_precision_not_statically_known(acl201):
    source = PREPARED.replace('mixed_precision="fp16"', "mixed_precision=args.mixed_precision")
    assert acl201.findings(source) == []
    assert acl201.findings(PREPARED.replace('mixed_precision="fp16"', "**kwargs")) == []


def test_accelerator_pinned_to_no(acl201):
    assert acl201.findings(PREPARED.replace('"fp16"', '"no"')) == []


def test_file_without_training_loop(acl201):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model = accelerator.prepare(model)
    with torch.autocast("cuda"):
        images = model(prompts)
    """
    assert acl201.findings(source) == []
