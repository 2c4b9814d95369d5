"""ACL501 device-move-before-prepare: a hard-coded CUDA move before `prepare` places the model."""

from __future__ import annotations

import textwrap

import pytest

CUDA_CHAIN = """
import torch
from accelerate import Accelerator

model = Net().cuda()  # built on the GPU
opt = torch.optim.AdamW(model.parameters())
accelerator = Accelerator()
model, opt = accelerator.prepare(model, opt)
"""


def test_cuda_in_the_constructor_chain_is_dropped(acl501, at):
    assert acl501.findings(CUDA_CHAIN) == [("ACL501", *at(CUDA_CHAIN, "cuda()"))]
    assert acl501.fixed(CUDA_CHAIN) == textwrap.dedent(CUDA_CHAIN).replace(
        "model = Net().cuda()", "model = Net()"
    )


@pytest.mark.parametrize(
    "move",
    [
        '.to("cuda")',
        '.to("cuda:0")',
        ".cuda(0)",
        '.to(torch.device("cuda"))',
        '.to(device="cuda")',
    ],
)
def test_literal_cuda_spellings(acl501, at, move):
    source = f"""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net(){move}
    model = accelerator.prepare(model)
    """
    method = move[1:].split("(")[0]
    assert acl501.findings(source) == [("ACL501", *at(source, f"{method}("))]
    assert "\nmodel = Net()\n" in acl501.fixed(source)


def test_device_name_bound_to_a_cuda_literal_or_a_cuda_else_cpu_choice(acl501, at):
    source = """
    import torch
    from accelerate import Accelerator

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    accelerator = Accelerator(mixed_precision="bf16")
    net = Net().to(device)
    dev = "cuda"
    head = Head().to(dev, torch.bfloat16)
    net, head = accelerator.prepare(net, head)
    """
    assert acl501.findings(source) == [
        ("ACL501", *at(source, "to(device)")),
        ("ACL501", *at(source, "to(dev,")),
    ]
    fixed = acl501.fixed(source)
    assert "net = Net()\n" in fixed and "head = Head().to(torch.bfloat16)\n" in fixed


def test_move_as_its_own_statement_is_removed_with_its_line(acl501, at):
    source = """
    from accelerate import Accelerator

    def main():
        accelerator = Accelerator()
        model = Net()
        model.cuda()
        model = model.to("cuda")
        model = accelerator.prepare(model)
    """
    assert acl501.findings(source) == [
        ("ACL501", *at(source, "cuda()")),
        ("ACL501", *at(source, 'to("cuda")')),
    ]
    assert acl501.fixed(source) == textwrap.dedent(source).replace(
        '    model.cuda()\n    model = model.to("cuda")\n', ""
    )


def test_no_fix_when_something_before_prepare_needs_the_device(acl501, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net().cuda()
    warm = model(torch.zeros(1, 8, device="cuda"))
    model = accelerator.prepare(model)
    """
    assert acl501.findings(source) == [("ACL501", *at(source, "cuda()"))]
    assert acl501.fixed(source) == textwrap.dedent(source)


@pytest.mark.parametrize(
    "move",
    [
        ".to(accelerator.device)",
        ".to(torch.bfloat16)",
        ".half()",
        ".cuda(local_rank)",
        '.to(f"cuda:{local_rank}")',
        ".to(rank_device)",
    ],
)
def test_rank_devices_engine_devices_and_dtype_moves_are_clean(acl501, move):
    source = f"""
    import os
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    local_rank = int(os.environ["LOCAL_RANK"])
    rank_device = torch.device("cuda", local_rank)
    model = Net(){move}
    model = accelerator.prepare(model)
    """
    assert acl501.findings(source) == []


def test_device_placement_off_is_clean(acl501):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(device_placement=False)
    model = Net().cuda()
    model = accelerator.prepare(model)
    """
    assert acl501.findings(source) == []


def test_a_model_never_prepared_gets_a_hint_without_a_fix(acl501, at):
    """The catalogue: frozen helpers still need a placement; suggest the rank's own device."""
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    vae = AutoencoderKL.from_pretrained(path).cuda()  # frozen helper, never prepared
    teacher = Teacher()
    teacher.to("cuda")
    unet = UNet()
    unet = accelerator.prepare(unet)
    """
    (vae, teacher) = acl501.diagnostics(source)
    assert [(d.start.line, d.start.column) for d in (vae, teacher)] == [
        at(source, "cuda()"),
        at(source, 'to("cuda")'),
    ]
    assert vae.severity == "info" and vae.fix is None
    assert "use `.to(accelerator.device)`" in teacher.message
    assert acl501.fixed(source) == textwrap.dedent(source)


def test_helpers_on_the_ranks_device_tensors_and_scripts_without_an_engine_are_clean(acl501):
    for source in [
        """
        from accelerate import Accelerator

        accelerator = Accelerator()
        vae = AutoencoderKL.from_pretrained(path).to(accelerator.device)
        x = torch.randn(4, 3).cuda()
        batch = batch.to("cuda")
        """,
        """
        vae = AutoencoderKL.from_pretrained(path).cuda()  # no engine: a single-GPU script
        """,
        """
        from accelerate import Accelerator

        accelerator = Accelerator(device_placement=False)
        teacher = Teacher().cuda()
        """,
    ]:
        assert acl501.findings(source) == [], source


def test_move_after_prepare_is_clean(acl501):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net()
    model = accelerator.prepare(model)
    model.cuda()
    """
    assert acl501.findings(source) == []


def test_no_fix_when_a_tensor_is_created_on_the_parameters_device(acl501, at):
    source = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net().to("cuda")
    opt = torch.optim.AdamW(model.parameters())
    mask = torch.ones(4, device=next(model.parameters()).device)
    model, opt = accelerator.prepare(model, opt)
    """
    assert acl501.findings(source) == [("ACL501", *at(source, 'to("cuda")'))]
    assert acl501.fixed(source) == textwrap.dedent(source)
