"""ACL202 backward-in-autocast: a backward written inside an enabled autocast region."""

from __future__ import annotations

import textwrap

RAW = """
import torch

for x, y in dl:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = crit(model(x), y)
        scaler.scale(loss).backward()  # keep this comment
    scaler.step(opt)
    scaler.update()
"""


def test_trailing_backward_is_moved_out_of_the_block(acl202, at):
    assert acl202.findings(RAW) == [("ACL202", *at(RAW, "scaler.scale(loss).backward()"))]
    (diagnostic,) = acl202.diagnostics(RAW)
    assert diagnostic.fix.applicability == "safe"
    assert "autocast region of line 5" in diagnostic.message
    assert acl202.fixed(RAW) == textwrap.dedent(RAW).replace(
        "        scaler.scale(loss).backward()", "    scaler.scale(loss).backward()"
    )


def test_backward_followed_by_other_statements_has_no_fix(acl202, at):
    source = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y)
            loss.backward()
            stats = model(x).mean()
        opt.step()
    """
    assert acl202.findings(source) == [("ACL202", *at(source, "loss.backward()"))]
    (diagnostic,) = acl202.diagnostics(source)
    assert diagnostic.fix is None
    assert "no automatic fix" in diagnostic.message


def test_backward_alone_in_the_block_has_no_fix(acl202, at):
    source = """
    import torch

    for x, y in dl:
        loss = crit(model(x), y)
        with torch.autocast("cuda"):
            loss.backward()
        opt.step()
    """
    assert acl202.findings(source) == [("ACL202", *at(source, "loss.backward()"))]
    assert acl202.fixed(source) == textwrap.dedent(source)


def test_multi_line_backward_keeps_its_continuation_indentation(acl202):
    source = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y)
            loss.backward(
                retain_graph=True,
            )
        opt.step()
    """
    assert acl202.fixed(source) == textwrap.dedent(source).replace(
        "        loss.backward(\n            retain_graph=True,\n        )",
        "    loss.backward(\n        retain_graph=True,\n    )",
    )


def test_accelerator_backward_inside_accelerator_autocast(acl202, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.autocast():
            loss = model(**batch).loss
            accelerator.backward(loss)
        opt.step()
    """
    assert acl202.findings(source) == [("ACL202", *at(source, "accelerator.backward(loss)"))]
    assert "    accelerator.backward(loss)\n    opt.step()" in acl202.fixed(source)


def test_guard_engine_backward_inside_torch_autocast(acl202, at):
    source = """
    import guard
    import torch

    engine = guard.Engine(mixed_precision="fp16", gradient_accumulation_steps=2)
    model, opt, dl = engine.prepare(model, opt, dl)
    step = 0
    while step < 100:
        x, y = next(it)
        with torch.amp.autocast("cuda", dtype=torch.float16):
            engine.backward(crit(model(x), y))
        opt.step()
        step += 1
    """
    assert acl202.findings(source) == [("ACL202", *at(source, "engine.backward("))]


def test_aliases_and_trainer_method(acl202, at):
    source = """
    from torch.cuda.amp import autocast as ac

    class Trainer:
        def train(self, dl):
            for x, y in dl:
                with ac():
                    loss = self.crit(self.model(x), y)
                    self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
    """
    assert acl202.findings(source) == [("ACL202", *at(source, "self.scaler.scale"))]
    module_alias = """
    import torch.cuda.amp as amp

    for x, y in dl:
        with amp.autocast():
            loss = crit(model(x), y)
            loss.backward()
        opt.step()
    """
    assert acl202.findings(module_alias) == [("ACL202", *at(module_alias, "loss.backward()"))]
    from_torch = module_alias.replace("import torch.cuda.amp as amp", "from torch import autocast")
    from_torch = from_torch.replace("amp.autocast()", 'autocast("cuda")')
    assert acl202.findings(from_torch) == [("ACL202", *at(from_torch, "loss.backward()"))]


def test_helper_function_and_autograd_backward(acl202, at):
    source = """
    import torch

    def train_one_epoch(model, loader, optimizer):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
                torch.autograd.backward(loss)
            optimizer.step()
    """
    assert acl202.findings(source) == [("ACL202", *at(source, "torch.autograd.backward"))]


def test_context_bound_to_a_name_nanogpt_style(acl202, at):
    source = """
    from contextlib import nullcontext

    import torch

    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, dtype=ptdtype)
    for it in range(max_iters):
        with ctx:
            logits, loss = model(X, Y)
            loss.backward()
        optimizer.step()
    """
    assert acl202.findings(source) == [("ACL202", *at(source, "loss.backward()"))]


def test_fp32_island_inside_the_region_is_not_flagged(acl202):
    source = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(model(x), y)
            with torch.autocast("cuda", enabled=False):
                loss.backward()
        opt.step()
    """
    assert acl202.findings(source) == []


def test_gradient_penalty_with_autograd_grad_is_not_flagged(acl202):
    source = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(x)
            (g,) = torch.autograd.grad(pred.sum(), x, create_graph=True)
            loss = crit(pred, y) + g.pow(2).mean()
        loss.backward()
        opt.step()
    """
    assert acl202.findings(source) == []


def test_backward_in_a_function_called_from_the_region_is_not_flagged(acl202):
    source = """
    import torch

    def backward_step(loss):
        loss.backward()

    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y)
            backward_step(loss)
        opt.step()
    """
    assert acl202.findings(source) == []


def test_disabled_region_and_fp32_engine_autocast_are_not_flagged(acl202):
    disabled = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda", enabled=False):
            loss = crit(model(x), y)
            loss.backward()
        opt.step()
    """
    assert acl202.findings(disabled) == []
    fp32_engine = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="no")
    model, opt = accelerator.prepare(model, opt)
    for x in dl:
        with accelerator.autocast():
            loss = model(x).mean()
            accelerator.backward(loss)
        opt.step()
    """
    assert acl202.findings(fp32_engine) == []
