"""ACL107 fp16-params-with-scaler: trained parameters stored in fp16 (or low precision under
accumulation)."""

from __future__ import annotations

RAW = """
import torch

model = Net().cuda().half()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda"):
        loss = crit(model(x.half()), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


def test_half_model_trained_with_a_scaler(acl107, at):
    assert acl107.findings(RAW) == [("ACL107", *at(RAW, "half()"))]
    (diagnostic,) = acl107.diagnostics(RAW)
    assert diagnostic.fix is None
    assert "`model` is cast to fp16" in diagnostic.message
    assert "GradScaler `scaler`" in diagnostic.message
    assert diagnostic.severity is None  # the rule's own: unscale_ raises, an error
    assert __import__("rules").ALL_RULES["ACL107"].severity == "error"


def test_in_place_casts(acl107, at):
    in_place = RAW.replace("model = Net().cuda().half()", "model = Net().cuda()\nmodel.half()")
    assert acl107.findings(in_place) == [("ACL107", *at(in_place, "half()"))]
    to_dtype = RAW.replace(".half()\n", ".to(torch.float16)\n", 1)
    assert acl107.findings(to_dtype) == [("ACL107", *at(to_dtype, "torch.float16"))]
    keyword = RAW.replace(".half()\n", '.to("cuda", dtype=torch.half)\n', 1)
    assert acl107.findings(keyword) == [("ACL107", *at(keyword, "torch.half"))]


def test_from_pretrained_fp16_under_an_fp16_accelerator(acl107, at):
    source = """
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)
    accelerator = Accelerator(mixed_precision="fp16")
    model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        opt.step()
    """
    assert acl107.findings(source) == [("ACL107", *at(source, "torch_dtype="))]
    assert "`accelerator` (fp16)" in acl107.diagnostics(source)[0].message
    fp32 = source.replace("torch.float16", "torch.float32")
    assert acl107.findings(fp32) == []


def test_guard_engine_and_a_name_bound_to_the_parameters(acl107, at):
    source = """
    import guard
    import torch

    def main():
        model = Net().half()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params)
        engine = guard.Engine(mixed_precision="fp16")
        model, optimizer = engine.prepare(model, optimizer)
        for x in dl:
            engine.backward(model(x).mean())
            optimizer.step()
    """
    assert acl107.findings(source) == [("ACL107", *at(source, "half()"))]


def test_trainer_class_attributes(acl107, at):
    source = """
    import torch
    from torch.cuda.amp import GradScaler

    class Trainer:
        def __init__(self):
            self.model = Net().to(torch.float16)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.scaler = GradScaler()

        def fit(self, dl):
            for x, y in dl:
                self.scaler.scale(self.model(x).mean()).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
    """
    assert acl107.findings(source) == [("ACL107", *at(source, "torch.float16"))]


def test_bf16_weights_under_accumulation(acl107, at):
    source = """
    import torch
    from accelerate import Accelerator

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=8)
    opt = torch.optim.AdamW(model.parameters())
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
    """
    assert acl107.findings(source) == [("ACL107", *at(source, "torch_dtype="))]
    (diagnostic,) = acl107.diagnostics(source)
    assert "accumulate" in diagnostic.message
    assert diagnostic.severity == "warning"  # precision lost gradually, nothing fails
    once = source.replace("gradient_accumulation_steps=8", "gradient_accumulation_steps=1")
    assert acl107.findings(once) == []


def test_bf16_weights_with_a_manual_while_loop_window(acl107, at):
    source = """
    import torch

    model = Net().bfloat16()
    opt = torch.optim.AdamW(model.parameters())
    micro = 0
    while True:
        x = next(it)
        (model(x).mean() / 4).backward()
        micro += 1
        if micro == 4:
            opt.step()
            opt.zero_grad()
            micro = 0
    """
    assert acl107.findings(source) == [("ACL107", *at(source, "bfloat16()"))]


def test_frozen_models_are_not_flagged(acl107):
    source = """
    import torch

    vae = AutoencoderKL.from_pretrained(name).to("cuda", dtype=torch.float16)
    text_encoder = CLIPTextModel.from_pretrained(name, torch_dtype=torch.float16)
    text_encoder.requires_grad_(False)
    teacher = Net().half()
    for p in teacher.parameters():
        p.requires_grad = False
    encoder = Net().half().requires_grad_(False)
    optimizer = torch.optim.AdamW(
        list(unet.parameters()) + list(text_encoder.parameters()) + list(teacher.parameters())
        + list(encoder.parameters())
    )
    scaler = torch.amp.GradScaler("cuda")
    for batch in dl:
        with torch.autocast("cuda"):
            loss = unet(vae.encode(batch), text_encoder(batch)).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    assert acl107.findings(source) == []


def test_adapter_wrappers_are_left_to_the_runtime_check(acl107):
    source = """
    import torch
    from peft import get_peft_model

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)
    model = get_peft_model(model, lora_config)
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    for batch in dl:
        scaler.scale(model(**batch).loss).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    assert acl107.findings(source) == []


def test_auto_or_variable_dtypes_are_not_flagged(acl107):
    auto = RAW.replace(".half()\n", '.to(dtype="auto")\n', 1)
    assert acl107.findings(auto) == []
    variable = RAW.replace(".half()\n", ".to(dtype=weight_dtype)\n", 1)
    assert acl107.findings(variable) == []


def test_a_cast_in_an_evaluation_function_of_its_own_is_not_flagged(acl107):
    """The model reloaded in fp16 for validation is another object than the trained one."""
    source = """
    import torch

    def log_validation(path):
        model = Net.from_pretrained(path, torch_dtype=torch.float16)
        return evaluate(model)

    def main():
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for x in dl:
            with torch.autocast("cuda"):
                loss = model(x).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        log_validation("out")
    """
    assert acl107.findings(source) == []


def test_pure_fp16_without_scaler_or_accumulation_and_tensor_casts_are_not_flagged(acl107):
    no_scaler = """
    import torch

    model = Net().half()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for x, y in dl:
        loss = crit(model(x.half()), y)
        loss.backward()
        optimizer.step()
    """
    assert acl107.findings(no_scaler) == []
    bf16 = RAW.replace(".half()\n", ".bfloat16()\n", 1)
    assert acl107.findings(bf16) == []  # bf16 under a scaler is ACL105's; no accumulation here
    tensors = RAW.replace("model = Net().cuda().half()", "model = Net().cuda()")
    assert acl107.findings(tensors) == []


def test_the_last_cast_of_a_chain_wins(acl107, at):
    """`.half().float()` rounds the weights through fp16 but leaves them in fp32."""
    round_trip = RAW.replace(
        "model = Net().cuda().half()", "model = Net().cuda()\nmodel.half().float()"
    )
    assert acl107.findings(round_trip) == []
    back_down = RAW.replace(".half()\n", ".float().half()\n", 1)
    assert acl107.findings(back_down) == [("ACL107", *at(back_down, "half()"))]


def test_freezing_only_some_layers_keeps_the_model_trained(acl107, at):
    source = RAW.replace(
        "optimizer = ",
        "for name, p in model.named_parameters():\n"
        "    p.requires_grad = True\n"
        "    if name.startswith('stem'):\n"
        "        p.requires_grad = False\n"
        "optimizer = ",
    )
    assert acl107.findings(source) == [("ACL107", *at(source, "half()"))]
    frozen = RAW.replace(
        "optimizer = ", "for p in model.parameters():\n    p.requires_grad = False\noptimizer = "
    )
    assert acl107.findings(frozen) == []


def test_master_weight_optimizers_that_take_the_scaler_are_left_to_the_runtime(acl107):
    """apex's fused optimizers keep fp32 master copies of fp16 weights and unscale themselves
    (and a list named `param_optimizer` is not an optimizer)."""
    source = RAW.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)",
        "param_optimizer = list(model.named_parameters())\n"
        "optimizer = DistributedFusedLAMB(param_optimizer, lr=1e-3)",
    )
    source = "from apex.contrib.optimizers import DistributedFusedLAMB\n" + source
    assert acl107.findings(source) == []


def test_project_optimizers_with_their_own_master_weights_are_left_to_the_runtime(acl107):
    """An optimizer the linter cannot see into (a project's fused LAMB, `build_optimizer(model,
    cfg)`) may keep fp32 master weights and handle the scaler itself."""
    for construction in ("FusedLambWithMasters(model.parameters())", "build_optimizer(model, cfg)"):
        source = RAW.replace("torch.optim.SGD(model.parameters(), lr=1e-3)", construction)
        source = "from myproject.optim import FusedLambWithMasters, build_optimizer\n" + source
        assert acl107.findings(source) == [], construction


def test_a_cast_after_the_training_loop_is_for_evaluation(acl107):
    source = """
    import torch

    def main(args):
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for x in dl:
            with torch.autocast("cuda"):
                loss = model(x).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if args.predict:
            model.half()
            evaluate(model)
    """
    assert acl107.findings(source) == []
    before = source.replace("        for x in dl:", "        model.half()\n        for x in dl:")
    assert acl107.findings(before) != []


UNFROZEN_LATER = """
import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="fp16")
unet = UNet2DConditionModel.from_pretrained(name)
vae = AutoencoderKL.from_pretrained(name)
unet.requires_grad_(False)
vae.requires_grad_(False)
unet.requires_grad_(True)
unet.half()
vae.to(accelerator.device, dtype=torch.float16)
optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
unet, optimizer = accelerator.prepare(unet, optimizer)
for batch in dl:
    loss = unet(vae.encode(batch)).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
"""


def test_a_later_unfreeze_trains_the_cast_model(acl107, at):
    """The last `requires_grad_` before training wins: frozen, then unfrozen, is trained."""
    assert acl107.findings(UNFROZEN_LATER) == [("ACL107", *at(UNFROZEN_LATER, "half()"))]
    looped = UNFROZEN_LATER.replace(
        "unet.requires_grad_(True)", "for p in unet.parameters():\n    p.requires_grad = True"
    )
    assert acl107.findings(looped) == [("ACL107", *at(looped, "half()"))]


def test_frozen_again_after_the_unfreeze_or_the_cast(acl107):
    refrozen = UNFROZEN_LATER.replace(
        "unet.requires_grad_(True)", "unet.requires_grad_(True)\nunet.requires_grad_(False)"
    )
    assert acl107.findings(refrozen) == []
    after_cast = UNFROZEN_LATER.replace("unet.half()", "unet.half()\nunet.requires_grad_(False)")
    assert acl107.findings(after_cast) == []
