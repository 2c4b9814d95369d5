"""ACL204 autocast-dtype-conflict: a user region's dtype differs from the engine's precision."""

from __future__ import annotations

BF16_ENGINE = """
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="bf16")
model, opt, dl = accelerator.prepare(model, opt, dl)
for x, t in dl:
    logits = model(x)
    with torch.autocast("cuda"):
        aux = kl_term(logits, teacher(x))
    accelerator.backward(crit(logits, t) + aux)
    opt.step()
"""


def test_cuda_default_fp16_region_under_bf16_accelerator(acl204, at):
    assert acl204.findings(BF16_ENGINE) == [("ACL204", *at(BF16_ENGINE, "torch.autocast("))]
    (diagnostic,) = acl204.diagnostics(BF16_ENGINE)
    assert diagnostic.fix is None
    assert "fp16 (the cuda default)" in diagnostic.message
    assert "trains in bf16" in diagnostic.message


def test_explicit_bf16_region_under_fp16_guard_engine(acl204, at):
    source = """
    import guard
    import torch

    engine = guard.Engine(mixed_precision="fp16")
    model, opt = engine.prepare(model, opt)
    step = 0
    while step < 10:
        out = model(x)
        with torch.amp.autocast("cuda", dtype=torch.bfloat16):
            aux = out.float().exp().mean()
        engine.backward(out.mean() + aux)
        step += 1
    """
    assert acl204.findings(source) == [("ACL204", *at(source, "torch.amp.autocast("))]


CPU_REGION = """
from accelerate import Accelerator
from torch import autocast

def train_one_epoch(accelerator, model, dl, opt):
    for x in dl:
        out = model(x)
        with autocast("cpu"):
            aux = head(out)
        accelerator.backward(aux.mean())
        opt.step()

accelerator = Accelerator(mixed_precision="fp16")
model, opt, dl = accelerator.prepare(model, opt, dl)
train_one_epoch(accelerator, model, dl, opt)
"""


def test_a_cpu_region_is_not_compared_with_an_engine_on_the_gpu(acl204):
    """A CPU autocast changes CPU ops only: beside an fp16 or bf16 engine on the GPU (or an
    fp16 one on the CPU, which Accelerate runs in fp32: ACL602) no Half meets a BFloat16."""
    assert acl204.findings(CPU_REGION) == []
    on_cpu = CPU_REGION.replace('mixed_precision="fp16"', 'cpu=True, mixed_precision="fp16"')
    assert acl204.findings(on_cpu) == []
    written = CPU_REGION.replace('autocast("cpu")', 'autocast("cpu", dtype=torch.float16)')
    assert acl204.findings(written.replace('"fp16"', '"bf16"')) == []


def test_a_cpu_region_conflicts_with_a_bf16_engine_pinned_to_the_cpu(acl204, at):
    source = CPU_REGION.replace('autocast("cpu")', 'autocast("cpu", dtype=torch.float16)')
    source = source.replace('mixed_precision="fp16"', 'cpu=True, mixed_precision="bf16"')
    assert acl204.findings(source) == [("ACL204", *at(source, 'autocast("cpu"'))]


def test_aliased_autocast_in_a_trainer_class(acl204, at):
    source = """
    from accelerate import Accelerator
    from torch.cuda.amp import autocast as ac

    class Trainer:
        def __init__(self, model, opt):
            self.accelerator = Accelerator(mixed_precision="bf16")
            self.model, self.opt = self.accelerator.prepare(model, opt)

        def fit(self, dl):
            for x in dl:
                feats = self.model(x)
                with ac():
                    aux = self.probe(feats)
                self.accelerator.backward(aux.mean())
                self.opt.step()
    """
    assert acl204.findings(source) == [("ACL204", *at(source, "ac()"))]
    assert "self.accelerator" in acl204.diagnostics(source)[0].message


def test_engine_autocast_under_precision_no(acl204, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="no")
    model, opt = accelerator.prepare(model, opt)
    for x in dl:
        with accelerator.autocast():
            loss = model(x).mean()
        accelerator.backward(loss)
    """
    assert acl204.findings(source) == [("ACL204", *at(source, "accelerator.autocast()"))]
    guard_default = """
    import guard

    engine = guard.Engine(gradient_accumulation_steps=4)
    model, opt = engine.prepare(model, opt)
    for x in dl:
        with engine.autocast():
            loss = model(x).mean()
        engine.backward(loss)
    """
    assert acl204.findings(guard_default) == [("ACL204", *at(guard_default, "engine.autocast()"))]


def test_precision_not_statically_known_is_not_flagged(acl204):
    from_cli = BF16_ENGINE.replace('mixed_precision="bf16"', "mixed_precision=args.mixed_precision")
    assert acl204.findings(from_cli) == []
    from_config = BF16_ENGINE.replace('mixed_precision="bf16"', "**config")
    assert acl204.findings(from_config) == []


def test_fp32_island_and_matching_dtypes_are_not_flagged(acl204):
    island = BF16_ENGINE.replace('torch.autocast("cuda")', 'torch.autocast("cuda", enabled=False)')
    assert acl204.findings(island) == []
    same = BF16_ENGINE.replace('torch.autocast("cuda")', 'torch.autocast("cuda", torch.bfloat16)')
    assert acl204.findings(same) == []
    engine_region = BF16_ENGINE.replace('torch.autocast("cuda")', "accelerator.autocast()")
    assert acl204.findings(engine_region) == []
    fp16 = engine_region.replace('"bf16"', '"fp16"')
    assert acl204.findings(fp16) == []


def test_dtype_from_a_variable_is_not_flagged(acl204):
    source = BF16_ENGINE.replace(
        'torch.autocast("cuda")', 'torch.autocast("cuda", dtype=amp_dtype)'
    )
    assert acl204.findings(source) == []
    device = BF16_ENGINE.replace('torch.autocast("cuda")', "torch.autocast(device.type)")
    assert acl204.findings(device) == []


def test_modules_without_an_engine_are_not_flagged(acl204):
    source = """
    import torch

    for x, y in dl:
        with torch.autocast("cuda"):
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
    """
    assert acl204.findings(source) == []


def test_region_around_the_prepared_model_is_reported_beside_acl201(acl204, at):
    """ACL201 reports the region around the model; the dtype conflict is ACL204's, and ACL201's
    fix (`accelerator.autocast()`) resolves both."""
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for x, t in dl:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(model(x), t)
        accelerator.backward(loss)
        opt.step()
    """
    assert acl204.findings(source) == [("ACL204", *at(source, "torch.autocast("))]
    assert acl204.findings(source.replace("torch.float16", "torch.bfloat16")) == []


def test_user_amp_beside_an_fp32_engine_is_not_a_conflict(acl204):
    """Under "no" the user's own region is the only one (ACL106 judges its scaler)."""
    source = BF16_ENGINE.replace('"bf16"', '"no"')
    assert acl204.findings(source) == []


VALIDATION_IN_THE_EPOCH_LOOP = """
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="bf16")
model, opt, dl = accelerator.prepare(model, opt, dl)
for epoch in range(epochs):
    for x, t in dl:
        accelerator.backward(crit(model(x), t))
        opt.step()
        opt.zero_grad()
    if accelerator.is_main_process:
        images = []
        with torch.autocast("cuda"):
            images.append(pipeline(prompt).images[0])
        log_images(images)
"""


def test_a_region_whose_values_reach_no_backward_trains_nothing(acl204):
    """Validation images made every epoch inside the training loop: the next epoch's backward
    follows the region, but none of its values reaches that backward's loss."""
    assert acl204.findings(VALIDATION_IN_THE_EPOCH_LOOP) == []
    configured = VALIDATION_IN_THE_EPOCH_LOOP.replace(
        'Accelerator(mixed_precision="bf16")',
        "Accelerator(mixed_precision=args.mixed_precision)",
    ).replace(
        "import torch\n",
        "import argparse\nimport torch\n\np = argparse.ArgumentParser()\n"
        'p.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])\n'
        "args = p.parse_args()\n",
    )
    assert acl204.findings(configured) == []


def test_a_frozen_helper_whose_output_is_cut_to_uint8_trains_nothing(acl204):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    net, opt, dl = accelerator.prepare(net, opt, dl)
    for x in dl:
        with torch.autocast("cuda"):
            depth = depth_model(x)
        cond = (depth * 255.0).to(torch.uint8).float() / 255.0
        accelerator.backward(crit(net(x + cond)))
        opt.step()
    """
    assert acl204.findings(source) == []
    reaches = source.replace(".to(torch.uint8).float()", ".float()")
    assert [code for code, *_ in acl204.findings(reaches)] == ["ACL204"]


def test_a_value_that_reaches_the_loss_through_other_names_is_flagged(acl204, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for epoch in range(epochs):
        for x, t in dl:
            logits = model(x)
            terms = []
            with torch.autocast("cuda"):
                terms.append(kl_term(logits, teacher(x)))
            total = crit(logits, t) + sum(terms)
            accelerator.backward(total)
            opt.step()
    """
    assert acl204.findings(source) == [("ACL204", *at(source, "torch.autocast("))]
