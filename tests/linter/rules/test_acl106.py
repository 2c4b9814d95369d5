"""ACL106 fp16-without-scaler: an fp16 autocast forward backpropagated with no GradScaler."""

from __future__ import annotations

import textwrap

import libcst

from linter.analysis import analyze_source
from linter.fixer import fix_text

RAW = """
import torch

for x, y in dl:
    with torch.autocast("cuda"):
        loss = crit(model(x), y)
    loss.backward()
    opt.step()
"""


def test_cuda_region_without_dtype_is_flagged(acl106, at):
    assert acl106.findings(RAW) == [("ACL106", *at(RAW, "torch.autocast("))]
    (diagnostic,) = acl106.diagnostics(RAW)
    assert diagnostic.fix is None
    assert "float16 by default on CUDA" in diagnostic.message
    assert "line 7" in diagnostic.message


def test_explicit_fp16_with_a_device_variable(acl106, at):
    source = """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for x, y in dl:
        with torch.autocast(device, dtype=torch.float16):
            loss = crit(model(x), y)
        loss.backward()
        opt.step()
    """
    assert acl106.findings(source) == [("ACL106", *at(source, "torch.autocast("))]


def test_aliased_cuda_autocast_in_a_trainer_method(acl106, at):
    source = """
    from torch.cuda.amp import autocast as ac

    class Trainer:
        def step(self, x, y):
            with ac():
                out = self.model(x)
            loss = self.crit(out, y)
            loss.backward()
            self.optimizer.step()

        def fit(self, dl):
            for x, y in dl:
                self.step(x, y)
    """
    assert acl106.findings(source) == [("ACL106", *at(source, "ac()"))]
    module_alias = """
    import torch.cuda.amp as amp

    def train_one_epoch(model, loader, optimizer):
        step = 0
        while step < len(loader):
            x, y = loader[step]
            with amp.autocast():
                loss = model(x, y)
            loss.backward()
            optimizer.step()
            step += 1
    """
    assert acl106.findings(module_alias) == [("ACL106", *at(module_alias, "amp.autocast()"))]


def test_accelerator_pinned_to_fp32_does_not_scale_the_users_fp16(acl106, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="no")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(model(x), y)
        accelerator.backward(loss)
        opt.step()
    """
    assert acl106.findings(source) == [("ACL106", *at(source, "torch.autocast("))]


def test_bf16_cpu_and_disabled_regions_are_not_flagged(acl106):
    assert acl106.findings(RAW.replace('"cuda")', '"cuda", dtype=torch.bfloat16)')) == []
    assert acl106.findings(RAW.replace('"cuda")', '"cpu")')) == []
    assert acl106.findings(RAW.replace('"cuda")', '"cpu", dtype=torch.float16)')) == []
    assert acl106.findings(RAW.replace('"cuda")', '"cuda", enabled=False)')) == []


def test_dtype_from_a_variable_nanogpt_style_is_not_flagged(acl106):
    source = """
    from contextlib import nullcontext

    import torch

    ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, dtype=ptdtype)
    for it in range(max_iters):
        with ctx:
            logits, loss = model(X, Y)
        loss.backward()
        optimizer.step()
    """
    assert acl106.findings(source) == []


def test_region_factory_handed_in_is_not_flagged(acl106):
    """`autocast` here is whatever the caller passes (torch's, or a `nullcontext`)."""
    source = """
    def train(model, loader, optimizer, autocast):
        for batch in loader:
            with autocast():
                loss = model(batch)
            loss.backward()
            optimizer.step()
    """
    assert acl106.findings(source) == []
    imported = source.replace("def train(", "from torch.cuda.amp import autocast\n    def train(")
    assert acl106.findings(imported.replace(", autocast)", ")")) != []
    assert acl106.findings(source) == []


def test_inference_regions_are_not_flagged(acl106):
    no_grad = """
    import torch

    for x, y in dl:
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        with torch.no_grad(), torch.autocast("cuda"):
            val = crit(model(x_val), y_val)
    """
    assert acl106.findings(no_grad) == []
    decorated = """
    import torch

    @torch.no_grad()
    def evaluate(model, x):
        with torch.autocast("cuda"):
            out = model(x)
        out.backward()
    """
    assert acl106.findings(decorated) == []
    no_backward = """
    import torch

    def predict(model, x):
        with torch.autocast("cuda"):
            return model(x)

    for x, y in dl:
        loss = crit(predict(model, x), y)
        loss.backward()
    """
    assert acl106.findings(no_backward) == []


def test_frozen_teacher_under_fp16_is_not_flagged(acl106):
    source = """
    import torch

    teacher = Net().cuda().requires_grad_(False)
    for x in dl:
        with torch.autocast("cuda"):
            soft = teacher(x).float().softmax(-1)
        loss = kl(student(x).log_softmax(-1), soft)
        loss.backward()
        opt.step()
    """
    assert acl106.findings(source) == []
    trained = source.replace(".requires_grad_(False)", "")
    assert acl106.findings(trained) != []


def test_any_scaler_in_the_module_is_not_flagged(acl106):
    passed_elsewhere = """
    import torch

    def train(model, dl, opt):
        for x, y in dl:
            with torch.autocast("cuda"):
                loss = crit(model(x), y)
            loss.backward()
            opt.step()

    scaler = torch.amp.GradScaler("cuda")
    train(model, dl, opt)
    run_other_loop(scaler)
    """
    assert acl106.findings(passed_elsewhere) == []
    handed_in = """
    import torch

    def train_one_epoch(model, loader, optimizer, loss_scaler):
        for x, y in loader:
            with torch.cuda.amp.autocast():
                loss = model(x, y)
            if loss_scaler is not None:
                loss_scaler(loss, optimizer)
            else:
                loss.backward()
                optimizer.step()
    """
    assert acl106.findings(handed_in) == []


def test_engine_backward_with_fp16_or_unknown_precision_is_not_flagged(acl106):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for x, y in dl:
        with torch.autocast("cuda"):
            loss = crit(model(x), y)
        accelerator.backward(loss)
        opt.step()
    """
    assert acl106.findings(source) == []
    assert acl106.findings(source.replace("args.mixed_precision", '"fp16"')) == []


SCALER_LOOP = """
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda"):
        loss = crit(model(x), y)
    loss.backward()
    scaler.step(opt)
    scaler.update()
"""


def test_raw_backward_in_a_scaler_loop_is_acl101_only_and_its_fix_is_the_whole_fix(at):
    """One root cause: the raw backward through the fp16 forward is ACL101's; after its fix
    neither rule has anything left to say."""

    def analyse(text):
        return analyze_source(text, "snippet.py", ["ACL101", "ACL106"])

    source = textwrap.dedent(SCALER_LOOP)
    found = [(d.code, d.start.line, d.start.column) for d in analyse(source)]
    assert found == [("ACL101", *at(SCALER_LOOP, "loss.backward()"))]
    outcome = fix_text(source, analyse, unsafe=False)
    libcst.parse_module(outcome.text)
    assert outcome.text == source.replace("loss.backward()", "scaler.scale(loss).backward()")
    assert analyse(outcome.text) == []


def test_backward_of_a_handed_in_gradient_is_not_a_trained_loss(acl106):
    """`out.backward(grad_out)` checks gradients of a non-scalar output; nothing is trained."""
    source = """
    import torch

    for shape in shapes:
        with torch.amp.autocast("cuda"):
            out = layer(inputs[shape])
        out.backward(grad_out[shape])
    """
    assert acl106.findings(source) == []
    assert acl106.findings(source.replace("out.backward(grad_out[shape])", "out.sum().backward()"))


def test_deepspeed_or_fabric_backward_may_scale_and_is_not_flagged(acl106):
    source = """
    import deepspeed
    import torch

    model_engine, optimizer, _, _ = deepspeed.initialize(model=net, config=cfg)
    for x, y in dl:
        with torch.autocast("cuda"):
            loss = crit(model_engine(x), y)
        model_engine.backward(loss)
        model_engine.step()
    """
    assert acl106.findings(source) == []
    fabric = source.replace("model_engine.backward(loss)", "fabric.backward(loss)")
    assert acl106.findings(fabric) == []
