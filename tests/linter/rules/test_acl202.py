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


def test_reported_as_a_warning(acl202):
    """PyTorch calls a backward under autocast "not recommended"; in eager mode it is mostly
    harmless, so not an error."""
    (diagnostic,) = acl202.diagnostics(RAW)
    assert diagnostic.severity is None  # the rule's own
    assert __import__("rules").ALL_RULES["ACL202"].severity == "warning"


MULTI = """
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="bf16")
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
for step, batch in enumerate(train_dataloader):
    if (step + 1) % gradient_accumulation_steps != 0:
        with accelerator.autocast(), accelerator.no_sync(model):  # skip the all-reduce
            outputs = model(**batch)
            loss = outputs.loss / gradient_accumulation_steps
            accelerator.backward(loss)
    else:
        with accelerator.autocast():
            outputs = model(**batch)
            loss = outputs.loss / gradient_accumulation_steps
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""

MULTI_FIXED = """
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="bf16")
model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
for step, batch in enumerate(train_dataloader):
    if (step + 1) % gradient_accumulation_steps != 0:
        with accelerator.no_sync(model):  # skip the all-reduce
            with accelerator.autocast():
                outputs = model(**batch)
                loss = outputs.loss / gradient_accumulation_steps
            accelerator.backward(loss)
    else:
        with accelerator.autocast():
            outputs = model(**batch)
            loss = outputs.loss / gradient_accumulation_steps
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""


def test_multi_item_with_keeps_the_backward_under_no_sync(acl202, at):
    """`with accelerator.autocast(), accelerator.no_sync(model):`: the backward leaves the
    autocast only; it must stay under `no_sync` (leaving it would all-reduce every micro-step)."""
    assert acl202.findings(MULTI) == [("ACL202", *at(MULTI, "accelerator.backward(loss)"))]
    (diagnostic,) = acl202.diagnostics(MULTI)
    assert diagnostic.fix.applicability == "safe"
    assert "end the autocast region before it" in diagnostic.message
    assert acl202.fixed(MULTI) == MULTI_FIXED


def test_multi_item_with_autocast_last_and_other_spellings(acl202):
    last = MULTI.replace(
        "accelerator.autocast(), accelerator.no_sync(model):",
        "accelerator.no_sync(model), accelerator.autocast():",
    )
    assert acl202.fixed(last) == MULTI_FIXED
    raw = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(net, device_ids=[rank])
    for micro_step in range(grad_accum_steps):
        with torch.autograd.detect_anomaly(), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y) / grad_accum_steps
            loss.backward()
    """
    assert acl202.fixed(raw) == textwrap.dedent(raw).replace(
        """    with torch.autograd.detect_anomaly(), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = crit(model(x), y) / grad_accum_steps
""",
        """    with torch.autograd.detect_anomaly():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = crit(model(x), y) / grad_accum_steps
""",
    )
    ddp = raw.replace(
        'torch.autograd.detect_anomaly(), torch.autocast("cuda", dtype=torch.bfloat16)',
        'torch.autocast("cuda", dtype=torch.bfloat16), model.no_sync()',
    )
    assert "    with model.no_sync():\n        with torch.autocast(" in acl202.fixed(ddp)


def test_multi_item_with_another_context_after_autocast_has_no_fix(acl202, at):
    """Splitting would enter that context before autocast instead of after it: not offered."""
    source = MULTI.replace(
        "accelerator.autocast(), accelerator.no_sync(model):",
        "accelerator.autocast(), torch.autograd.detect_anomaly():",
    )
    assert acl202.findings(source) == [("ACL202", *at(source, "accelerator.backward(loss)"))]
    (diagnostic,) = acl202.diagnostics(source)
    assert diagnostic.fix is None
    assert "no automatic fix, since the `with` enters other contexts too" in diagnostic.message
    assert acl202.fixed(source) == textwrap.dedent(source)
