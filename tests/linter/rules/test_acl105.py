"""ACL105 scaler-with-bf16: a GradScaler in a module that trains in bf16 only."""

from __future__ import annotations

import textwrap

import libcst
import pytest

from linter.analysis import analyze_source
from linter.fixer import fix_text

RAW = """
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = crit(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
"""

RAW_FIXED = """
import torch

for x, y in dl:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = crit(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
"""


def test_scaler_under_bf16_autocast_is_flagged_and_removed_unsafely(acl105, at):
    assert acl105.findings(RAW) == [("ACL105", *at(RAW, "torch.amp.GradScaler("))]
    (diagnostic,) = acl105.diagnostics(RAW)
    assert diagnostic.fix.applicability == "unsafe"
    assert "bf16 autocast on line 6" in diagnostic.message
    assert acl105.fixed(RAW) == textwrap.dedent(RAW)
    assert acl105.fixed(RAW, unsafe=True) == textwrap.dedent(RAW_FIXED)


def test_bf16_engines_with_a_user_scaler(acl105, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    scaler = torch.amp.GradScaler()
    for batch in dl:
        scaler.scale(model(**batch).loss).backward()
        scaler.step(opt); scaler.update()
    """
    assert acl105.findings(source) == [("ACL105", *at(source, "torch.amp.GradScaler("))]
    fixed = acl105.fixed(source, unsafe=True)
    assert "    model(**batch).loss.backward()\n    opt.step()\n" in fixed
    assert "scaler" not in fixed
    guard_engine = source.replace("from accelerate import Accelerator", "import guard")
    guard_engine = guard_engine.replace("Accelerator(", "guard.Engine(")
    assert acl105.findings(guard_engine) == [("ACL105", *at(guard_engine, "torch.amp.GradScaler("))]


def test_cpu_autocast_defaults_to_bf16(acl105, at):
    source = RAW.replace('torch.autocast("cuda", dtype=torch.bfloat16)', 'torch.autocast("cpu")')
    assert acl105.findings(source) == [("ACL105", *at(source, "torch.amp.GradScaler("))]


def test_scaler_switched_with_the_bf16_region(acl105, at):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp):
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    """
    assert acl105.findings(source) == [("ACL105", *at(source, "torch.amp.GradScaler("))]
    elsewhere = source.replace(
        '"cuda", enabled=args.amp', '"cuda", enabled=torch.cuda.is_available()'
    )
    assert acl105.findings(elsewhere) == []


def test_trainer_class_with_an_aliased_import(acl105, at):
    source = """
    import torch
    from torch.cuda.amp import GradScaler

    class Trainer:
        def __init__(self, model, opt):
            self.model, self.opt = model, opt
            self.scaler = GradScaler()

        def fit(self, dl):
            for x, y in dl:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = self.model(x).mean()
                self.scaler.scale(loss / 2).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
    """
    assert acl105.findings(source) == [("ACL105", *at(source, "GradScaler()"))]
    fixed = acl105.fixed(source, unsafe=True)
    assert "self.scaler" not in fixed
    assert "            (loss / 2).backward()\n            self.opt.step()\n" in fixed


def test_no_fix_when_the_scaler_is_used_otherwise(acl105, at):
    helper = """
    import torch

    def train_one_epoch(model, loader, optimizer, scaler):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    def main():
        scaler = torch.amp.GradScaler()
        train_one_epoch(model, loader, optimizer, scaler)
    """
    (diagnostic,) = acl105.diagnostics(helper)
    assert (diagnostic.start.line, diagnostic.start.column) == at(helper, "torch.amp.GradScaler(")
    assert diagnostic.fix is None
    assert "remove it by hand" in diagnostic.message
    checkpoint = RAW + 'torch.save({"scaler": scaler.state_dict()}, "ckpt.pt")\n'
    assert acl105.diagnostics(checkpoint)[0].fix is None
    lone_update = RAW.replace("    scaler.update()", "    if step_done:\n        scaler.update()")
    assert acl105.diagnostics(lone_update)[0].fix is None  # the `if` would be left empty


def test_scaler_that_follows_the_fp16_choice_is_not_flagged(acl105):
    for enabled in ("args.fp16", "(dtype == torch.float16)", "use_scaler"):
        source = RAW.replace('GradScaler("cuda")', f'GradScaler("cuda", enabled={enabled})')
        source = source.replace("scaler = ", "use_scaler = amp_dtype == 'float16'\nscaler = ")
        assert acl105.findings(source) == [], enabled
    disabled = RAW.replace('GradScaler("cuda")', 'GradScaler("cuda", enabled=False)')
    assert acl105.findings(disabled) == []


def test_dtype_from_a_variable_or_an_fp16_path_is_not_flagged(acl105):
    variable = RAW.replace("dtype=torch.bfloat16", "dtype=amp_dtype")
    assert acl105.findings(variable) == []
    choice = "amp_dtype = torch.bfloat16 if args.bf16 else torch.float16\n"
    assert acl105.findings(choice + RAW) == []
    flag = RAW.replace("for x, y in dl:", "model.half() if args.half else model\nfor x, y in dl:")
    assert acl105.findings(flag) == []


def test_bf16_accelerator_without_a_user_scaler_is_not_flagged(acl105):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        opt.step()
    """
    assert acl105.findings(source) == []


DEPRECATED = {
    "attribute": ("", "torch.cuda.amp.GradScaler()"),
    "import": ("from torch.cuda.amp import GradScaler\n", "GradScaler()"),
}


@pytest.mark.parametrize("spelling", sorted(DEPRECATED))
def test_deprecated_scaler_under_bf16_composes_with_acl203(spelling):
    """--fix applies ACL203's safe rename only; --unsafe-fixes also removes the scaler, and the
    result is the plain bf16 loop (no import of the deprecated module left behind)."""
    imports, construction = DEPRECATED[spelling]
    source = textwrap.dedent(RAW).replace("import torch\n", "import torch\n" + imports, 1)
    source = source.replace('torch.amp.GradScaler("cuda")', construction)

    def analyse(text):
        return analyze_source(text, "snippet.py", ["ACL105", "ACL203"])

    assert sorted({d.code for d in analyse(source)}) == ["ACL105", "ACL203"]
    safe = fix_text(source, analyse, unsafe=False).text
    assert safe == textwrap.dedent(RAW)
    assert [d.code for d in analyse(safe)] == ["ACL105"]
    unsafe = fix_text(source, analyse, unsafe=True).text
    libcst.parse_module(unsafe)
    assert unsafe == textwrap.dedent(RAW_FIXED)
    assert analyse(unsafe) == []


def test_fp32_parameters_under_a_scaler_are_a_warning(acl105):
    """Autocast keeps the weights fp32: the scaler wastes a sync per step, the results are
    right."""
    (diagnostic,) = acl105.diagnostics(RAW)
    assert diagnostic.severity is None  # the rule's own: a warning
    assert __import__("rules").ALL_RULES["ACL105"].severity == "warning"
    assert "gains nothing" in diagnostic.message


BF16_MODEL = """
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

accelerator = Accelerator(mixed_precision="bf16")
model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
scaler = torch.amp.GradScaler("cuda")
for batch in loader:
    scaler.scale(model(**batch).loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""


def test_trained_bf16_parameters_under_a_cuda_scaler_are_an_error(acl105, at):
    """bf16 gradients: torch's CUDA unscale kernel has no BFloat16 version, the first step
    raises."""
    (diagnostic,) = acl105.diagnostics(BF16_MODEL)
    assert (diagnostic.start.line, diagnostic.start.column) == at(BF16_MODEL, "torch.amp.Grad")
    assert diagnostic.severity == "error"
    assert "`model` is trained in bf16 (line 7)" in diagnostic.message
    half_cast = BF16_MODEL.replace(", torch_dtype=torch.bfloat16)", ").to(torch.bfloat16)")
    assert acl105.diagnostics(half_cast)[0].severity == "error"


def test_bf16_parameters_that_are_frozen_or_on_a_cpu_scaler_stay_a_warning(acl105, at):
    frozen = BF16_MODEL.replace(
        "model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16)",
        "model = AutoModelForCausalLM.from_pretrained(args.model)\n"
        "text_encoder = CLIPTextModel.from_pretrained(args.model, torch_dtype=torch.bfloat16)\n"
        "text_encoder.requires_grad_(False)",
    )
    assert "text_encoder.requires_grad_(False)" in frozen
    assert acl105.findings(frozen) == [("ACL105", *at(frozen, "torch.amp.GradScaler("))]
    assert acl105.diagnostics(frozen)[0].severity is None
    for cpu in ('torch.amp.GradScaler("cpu")', 'torch.amp.GradScaler(device="cpu")'):
        source = BF16_MODEL.replace('torch.amp.GradScaler("cuda")', cpu)
        (diagnostic,) = acl105.diagnostics(source)
        assert diagnostic.severity is None, cpu  # the CPU kernel unscales bf16
