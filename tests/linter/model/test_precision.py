"""The precision topic of the model: autocast regions, engine precision, parameter dtypes."""

from __future__ import annotations

import textwrap

import libcst

from linter.analysis import describe_loops
from linter.model import Model, param_dtypes, precision


def _model(source: str) -> Model:
    source = textwrap.dedent(source)
    return Model(libcst.parse_module(source), source)


def _regions(source: str) -> list[tuple]:
    return [
        (c.device, c.dtype, c.explicit, c.enabled, c.by_engine)
        for c in precision.autocasts(_model(source))
    ]


def test_autocast_device_dtype_and_enabled_in_every_spelling():
    source = """
    import torch
    import torch.cuda.amp as amp
    from torch import autocast
    from torch.cuda.amp import autocast as ac

    device = "cuda:0"
    with torch.autocast("cuda"):
        pass
    with torch.amp.autocast(device_type="cpu"):
        pass
    with ac(True, torch.bfloat16):
        pass
    with amp.autocast(enabled=False):
        pass
    with autocast(device, dtype=torch.float16, enabled=args.amp):
        pass
    with torch.autocast(dev.type, torch.bfloat16):
        pass
    with torch.autocast("cuda", dtype=amp_dtype):
        pass
    """
    assert _regions(source) == [
        ("cuda", "fp16", False, True, False),
        ("cpu", "bf16", False, True, False),
        ("cuda", "bf16", True, True, False),
        ("cuda", "fp16", False, False, False),
        ("cuda", "fp16", True, None, False),
        (None, "bf16", True, True, False),
        ("cuda", None, True, True, False),
    ]


def test_nanogpt_context_with_a_dtype_variable_is_not_statically_known():
    source = """
    from contextlib import nullcontext
    import torch

    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type, dtype=ptdtype)
    for it in range(10):
        with ctx:
            loss = model(X)
        loss.backward()
    """
    assert _regions(source) == [(None, None, True, True, False)]


def test_engine_precision_and_engine_autocast():
    source = """
    import guard
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16")
    with accelerator.autocast():
        pass
    """
    model = _model(source)
    assert precision.engine_precision(model) == "bf16"
    assert _regions(source) == [(None, "bf16", True, True, True)]
    assert precision.engine_precision(_model("import guard\nengine = guard.Engine()\n")) == "no"
    assert precision.engine_precision(_model('import guard\ne = guard.Engine("fp16")\n')) == "fp16"
    unknown = "from accelerate import Accelerator\na = Accelerator(mixed_precision=args.mp)\n"
    assert precision.engine_precision(_model(unknown)) is None
    both = 'from accelerate import Accelerator\na = Accelerator(mixed_precision="fp16")\n'
    both += 'b = Accelerator(mixed_precision="bf16")\n'
    assert precision.engine_precision(_model(both)) is None


def test_parameter_casts_know_trained_and_frozen_models():
    source = """
    import torch

    model = Net().to("cuda", dtype=torch.float16)
    vae = Vae().half().requires_grad_(False)
    text = Clip.from_pretrained(name, torch_dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters())
    """
    casts = [
        (c.name, c.dtype, c.trained, c.frozen) for c in param_dtypes.param_casts(_model(source))
    ]
    assert casts == [
        ("model", "fp16", True, False),
        ("vae", "fp16", False, True),
        ("text", "bf16", False, False),
    ]


def test_show_loops_lists_regions_and_parameter_dtypes():
    source = textwrap.dedent(
        """
        import torch

        model = Net().half()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        for x in dl:
            with torch.autocast("cuda"):
                loss = model(x).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        """
    )
    (loop,) = describe_loops(source, "train.py")["loops"]
    assert loop["precision"] == {
        "engine_precision": "no engine",
        "autocast": [
            {
                "code": 'torch.autocast("cuda")',
                "device": "cuda",
                "dtype": "fp16",
                "dtype_source": "device default",
                "enabled": "yes",
                "line": 8,
            }
        ],
        "parameter_dtypes": [
            {"model": "model", "dtype": "fp16", "trained": True, "frozen": False, "line": 4}
        ],
        "fp16_path": True,
    }
