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


def test_the_message_names_the_engine_made_later(acl501):
    (diagnostic,) = acl501.diagnostics(CUDA_CHAIN)
    assert diagnostic.message.startswith(
        "`model` is moved to CUDA before `accelerator` is created (line 7): until then "
        '`"cuda"` is GPU 0 on every rank'
    )


@pytest.mark.parametrize(
    "move", ['.to("cuda")', ".cuda()", '.to(torch.device("cuda"))', '.to(device="cuda")']
)
def test_bare_cuda_spellings_before_the_accelerator(acl501, at, move):
    source = f"""
    import torch
    from accelerate import Accelerator

    model = Net(){move}
    accelerator = Accelerator()
    model = accelerator.prepare(model)
    """
    method = move[1:].split("(")[0]
    assert acl501.findings(source) == [("ACL501", *at(source, f"{method}("))]
    assert "\nmodel = Net()\n" in acl501.fixed(source)


@pytest.mark.parametrize(
    "move",
    ['.to("cuda:0")', ".cuda(0)", '.to(torch.device("cuda", 0))', '.to(torch.device("cuda:0"))'],
)
def test_a_fixed_index_is_gpu_0_on_every_rank_even_after_the_accelerator(acl501, at, move):
    source = f"""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net(){move}
    model = accelerator.prepare(model)
    """
    method = move[1:].split("(")[0]
    (diagnostic,) = acl501.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, f"{method}(")
    assert "`model` is moved to `cuda:0` before `accelerator.prepare`" in diagnostic.message
    assert "\nmodel = Net()\n" in acl501.fixed(source)


@pytest.mark.parametrize(
    "move", ['.to("cuda")', ".cuda()", '.to(torch.device("cuda"))', '.to(device="cuda")']
)
def test_bare_cuda_after_the_accelerator_is_the_ranks_own_gpu(acl501, move):
    """`Accelerator()` calls `torch.cuda.set_device(local_rank)`; `prepare` then finds the model
    on the right device already."""
    source = f"""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net(){move}
    model = accelerator.prepare(model)
    """
    assert acl501.findings(source) == []


def test_device_name_bound_to_a_cuda_literal_or_a_cuda_else_cpu_choice(acl501, at):
    source = """
    import torch
    from accelerate import Accelerator

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = Net().to(device)
    dev = "cuda"
    head = Head().to(dev, torch.bfloat16)
    accelerator = Accelerator(mixed_precision="bf16")
    net, head = accelerator.prepare(net, head)
    """
    assert acl501.findings(source) == [
        ("ACL501", *at(source, "to(device)")),
        ("ACL501", *at(source, "to(dev,")),
    ]
    fixed = acl501.fixed(source)
    assert "net = Net()\n" in fixed and "head = Head().to(torch.bfloat16)\n" in fixed
    # the same names used after the Accelerator: the device is resolved when the move runs
    after = textwrap.dedent(source).replace(
        'accelerator = Accelerator(mixed_precision="bf16")\n', ""
    )
    after = after.replace(
        "net = Net()", 'accelerator = Accelerator(mixed_precision="bf16")\nnet = Net()'
    )
    assert after.index("Accelerator(") < after.index("Net().to")
    assert acl501.findings(after) == []


def test_move_as_its_own_statement_is_removed_with_its_line(acl501, at):
    source = """
    from accelerate import Accelerator

    def main():
        model = Net()
        model.cuda()
        model = model.to("cuda")
        accelerator = Accelerator()
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

    model = Net().cuda()
    warm = model(torch.zeros(1, 8, device="cuda"))
    accelerator = Accelerator()
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


DIFFUSERS = """
import torch
from accelerate import Accelerator
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.training_utils import EMAModel
from transformers import CLIPTextModel


def main():
    args = parse_args()
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=args.report_to,
    )
    weight_dtype = torch.float16 if accelerator.mixed_precision == "fp16" else torch.float32
    text_encoder = CLIPTextModel.from_pretrained(args.model, subfolder="text_encoder")
    vae = AutoencoderKL.from_pretrained(args.model, subfolder="vae")
    unet = UNet2DConditionModel.from_pretrained(args.model, subfolder="unet")
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    ema_unet = EMAModel(unet.parameters(), model_cls=UNet2DConditionModel)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate)
    unet, optimizer, train_dataloader = accelerator.prepare(unet, optimizer, train_dataloader)
    ema_unet.to("cuda")
    vae.to(accelerator.device, dtype=weight_dtype)
    text_encoder.to("cuda", dtype=weight_dtype)


if __name__ == "__main__":
    main()
"""


def test_frozen_helpers_moved_to_cuda_after_the_accelerator_are_on_the_ranks_gpu(acl501, at):
    """diffusers' training scripts: the VAE, text encoder and EMA copy are placed after
    `Accelerator(...)`, where "cuda" is the rank's own GPU. At most a style hint (off by
    default), never a warning, and nothing says GPU 0."""
    diagnostics = acl501.diagnostics(DIFFUSERS)
    assert [(d.start.line, d.start.column) for d in diagnostics] == [
        at(DIFFUSERS, 'to("cuda")'),
        at(DIFFUSERS, 'to("cuda", dtype'),
    ]
    assert all(d.is_hint and d.fix is None for d in diagnostics)
    assert not any("GPU 0" in d.message for d in diagnostics)
    assert "once `accelerator` exists that is this rank's own GPU" in diagnostics[0].message
    assert acl501.fixed(DIFFUSERS) == textwrap.dedent(DIFFUSERS)


def test_a_non_blocking_move_is_the_same_move(acl501, at):
    """diffusers' EMA offload: `ema_unet.to(device="cuda", non_blocking=True)`."""
    hint = DIFFUSERS.replace('ema_unet.to("cuda")', 'ema_unet.to(device="cuda", non_blocking=True)')
    assert acl501.diagnostics(hint)[0].is_hint
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = Net().to("cuda:0", non_blocking=True)
    model = accelerator.prepare(model)
    """
    assert acl501.findings(source) == [("ACL501", *at(source, "to("))]
    assert "\nmodel = Net()\n" in acl501.fixed(source)


def test_a_frozen_helper_moved_to_a_fixed_index_is_reported_without_a_fix(acl501, at):
    source = DIFFUSERS.replace('text_encoder.to("cuda", dtype', 'text_encoder.to("cuda:0", dtype')
    (warning,) = [d for d in acl501.diagnostics(source) if not d.is_hint]
    assert (warning.start.line, warning.start.column) == at(source, 'to("cuda:0"')
    assert warning.severity is None and warning.fix is None  # the rule's warning
    assert warning.message == (
        "`text_encoder` is never passed to `prepare` and is moved to `cuda:0`: every rank keeps "
        "its copy on GPU 0 (use `.to(accelerator.device)`)"
    )
    teacher = """
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher).cuda(0)
    reward_model = RewardModel(cfg).to(torch.device("cuda", 0))
    """
    assert acl501.findings(teacher) == [
        ("ACL501", *at(teacher, "cuda(0)")),
        ("ACL501", *at(teacher, "to(torch.device")),
    ]


def test_helpers_moved_before_the_accelerator_stay_on_gpu_0(acl501, at):
    """Built in a helper that `main()` calls before creating the Accelerator: program order
    follows the calls."""
    source = """
    from accelerate import Accelerator
    from diffusers import AutoencoderKL, UNet2DConditionModel


    def load_models(args):
        vae = AutoencoderKL.from_pretrained(args.model, subfolder="vae").to("cuda")
        unet = UNet2DConditionModel.from_pretrained(args.model, subfolder="unet")
        return vae, unet


    def main():
        args = parse_args()
        vae, unet = load_models(args)
        accelerator = Accelerator(mixed_precision="fp16")
        unet, optimizer = accelerator.prepare(unet, optimizer)


    if __name__ == "__main__":
        main()
    """
    (diagnostic,) = acl501.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, 'to("cuda")')
    assert not diagnostic.is_hint and diagnostic.fix is None
    assert "before `accelerator` is created (line 15)" in diagnostic.message
    made = '        accelerator = Accelerator(mixed_precision="fp16")\n'
    loaded = "        vae, unet = load_models(args)\n"
    made_first = source.replace(loaded + made, made + loaded)
    assert "vae, unet = load_models(args)\n        unet," in made_first
    assert [d for d in acl501.diagnostics(made_first) if not d.is_hint] == []
    placed_again = source.replace(
        "        return vae, unet", "        vae.to(args.device)\n        return vae, unet"
    )
    assert "vae.to(args.device)" in placed_again
    assert [d for d in acl501.diagnostics(placed_again) if not d.is_hint] == []


TRANSFORMERS = """
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM


def train(args, accelerator, model, train_dataloader):
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher).to(torch.device("cuda"))
    teacher.eval()
    model.to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    train(args, accelerator, model, get_dataloader(args))


if __name__ == "__main__":
    main()
"""


def test_moves_in_a_function_called_after_the_accelerator_is_made(acl501):
    """`main()` makes the Accelerator, then calls `train(...)`, which moves things: they run
    after `set_device`."""
    assert [d for d in acl501.diagnostics(TRANSFORMERS) if not d.is_hint] == []
    # a helper that gets no engine, called after the Accelerator is made
    helper = TRANSFORMERS.replace(
        "def main():",
        "def load_teacher(path):\n"
        '    teacher = AutoModelForCausalLM.from_pretrained(path).to("cuda")\n'
        "    teacher.eval()\n"
        "    return teacher\n\n\n"
        "def main():",
    ).replace("    train(args,", "    teacher = load_teacher(args.teacher)\n    train(args,")
    assert "    teacher = load_teacher(args.teacher)\n" in helper
    assert [d for d in acl501.diagnostics(helper) if not d.is_hint] == []


def test_a_model_moved_in_main_before_the_accelerator_it_is_prepared_by(acl501, at):
    source = """
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM


    def main():
        args = parse_args()
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).cuda()
        accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
        model, optimizer = accelerator.prepare(model, optimizer)


    if __name__ == "__main__":
        main()
    """
    assert acl501.findings(source) == [("ACL501", *at(source, "cuda()"))]
    assert ".from_pretrained(args.model_name_or_path)\n" in acl501.fixed(source)
    entry_point = source.replace(
        "    def main():", "    @hydra.main(config_path='conf')\n    def main():"
    )
    entry_point = entry_point.replace('if __name__ == "__main__":\n        main()\n', "")
    assert acl501.findings(entry_point) == [("ACL501", *at(entry_point, "cuda()"))]


@pytest.mark.parametrize(
    "first",
    [
        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
        "state = PartialState()",
        "accelerator = Accelerator()",
    ],
)
def test_the_device_set_by_set_device_or_accelerate_state_first(acl501, first):
    source = f"""
    import os
    import torch
    from accelerate import Accelerator, PartialState

    {first}
    model = Net().cuda()
    teacher = Teacher().to("cuda")
    accelerator = Accelerator()
    model = accelerator.prepare(model)
    """
    assert [d for d in acl501.diagnostics(source) if not d.is_hint] == []


def test_a_hook_defined_after_the_accelerator_runs_after_it(acl501):
    """diffusers registers load/save hooks on the Accelerator; nothing here calls them."""
    source = """
    from accelerate import Accelerator


    def main():
        args = parse_args()
        accelerator = Accelerator(mixed_precision=args.mixed_precision)

        def load_model_hook(models, input_dir):
            teacher = TeacherModel.from_pretrained(input_dir, subfolder="teacher").to("cuda")
            models.append(teacher)

        accelerator.register_load_state_pre_hook(load_model_hook)


    if __name__ == "__main__":
        main()
    """
    (hint,) = acl501.diagnostics(source)
    assert hint.is_hint


def test_a_trainer_class_that_makes_its_accelerator_in_init(acl501, at):
    source = """
    from accelerate import Accelerator


    class DistillTrainer:
        def __init__(self, args):
            self.teacher = AutoModel.from_pretrained(args.teacher).cuda()
            self.accelerator = Accelerator(mixed_precision=args.mixed_precision)
            self.ema = EMA(args.decay).to("cuda")

        def load_reward_model(self, path):
            self.reward = RewardModel.from_pretrained(path).to("cuda")
    """
    diagnostics = acl501.diagnostics(source)
    assert [(d.start.line, d.start.column, d.is_hint) for d in diagnostics] == [
        (*at(source, "cuda()"), False),
        (*at(source, 'to("cuda")'), True),
        (*at(source, 'to("cuda")', 1), True),
    ]
    assert "`self.teacher` is never passed to `prepare` and is moved to CUDA before" in (
        diagnostics[0].message
    )


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

    model = Net().to("cuda")
    opt = torch.optim.AdamW(model.parameters())
    mask = torch.ones(4, device=next(model.parameters()).device)
    accelerator = Accelerator()
    model, opt = accelerator.prepare(model, opt)
    """
    assert acl501.findings(source) == [("ACL501", *at(source, 'to("cuda")'))]
    assert acl501.fixed(source) == textwrap.dedent(source)
