"""Values of expressions under the script's configurations, evaluated jointly."""

from __future__ import annotations

import textwrap

import libcst

from linter.model import Model
from linter.model import config_values as cv
from linter.model.config_values import OTHER, AutocastValue, ScalerValue, TorchDtype


def build(source: str) -> Model:
    source = textwrap.dedent(source)
    return Model(libcst.parse_module(source), source)


def values_of(model: Model, *names: str, scope: str = "<module>"):
    """{settings: values} of names read at the end of a scope (module or function)."""
    found = next(s for s in model.scopes if s.name == scope)
    exprs = [(libcst.parse_expression(n), found, 1 << 29) for n in names]
    space = cv.joint(model, exprs)
    if space is None:
        return None
    names = {k.key: k.name for k in space.knobs}
    return {tuple((names[k], v) for k, v in r.settings if k in names): r.values for r in space.rows}


NANOGPT = """
import torch
from contextlib import nullcontext

gradient_accumulation_steps = 5 * 8
device = 'cuda'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
config_keys = [k for k, v in globals().items() if not k.startswith('_')]
exec(open('configurator.py').read())
device_type = 'cuda' if 'cuda' in device else 'cpu'
ptdtype = {
    'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16
}[dtype]
ctx = (
    nullcontext() if device_type == 'cpu'
    else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
"""


def test_an_overridable_global_takes_its_hardware_dependent_defaults_and_the_compared_literals():
    model = build(NANOGPT)
    space = cv.joint(model, [(libcst.parse_expression("ptdtype"), model.scopes[0], 1 << 29)])
    (knob,) = space.knobs
    assert knob.name == "dtype"
    assert knob.defaults == {"bfloat16", "float16"}  # a bf16 GPU, or not
    rows = {r.setting("dtype"): r.values[0] for r in space.rows}
    # 'float32' comes from the dict's keys; any other value raises KeyError: no run
    assert rows == {
        "bfloat16": {TorchDtype("bf16")},
        "float16": {TorchDtype("fp16")},
        "float32": {TorchDtype("fp32")},
    }


def test_the_autocast_and_the_scaler_are_read_together():
    found = values_of(build(NANOGPT), "ctx", "scaler")
    cuda = ("device", "cuda")
    assert found[(cuda, ("dtype", "float16"))] == (
        {AutocastValue("cuda", TorchDtype("fp16"), True)},
        {ScalerValue(True)},
    )
    assert found[(cuda, ("dtype", "bfloat16"))] == (
        {AutocastValue("cuda", TorchDtype("bf16"), True)},
        {ScalerValue(False)},
    )
    # a device the script never names: `'cuda' in device` cannot be decided
    other = found[(("device", OTHER), ("dtype", "float16"))][0]
    assert cv.NULL_CONTEXT in other and AutocastValue("cuda", TorchDtype("fp16"), True) in other


def test_argparse_choices_and_comparisons():
    model = build(
        """
        import argparse
        import torch

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument(
                "--precision", type=str, default="bf16", choices=["fp32", "bf16", "fp16"]
            )
            parser.add_argument("--use_amp", action="store_true")
            args = parser.parse_args()
            amp_dtype = torch.float16 if args.precision == "fp16" else torch.bfloat16
            on = args.use_amp and args.precision != "fp32"
            off = not args.use_amp or args.precision in ("fp32",)
        """
    )
    found = values_of(model, "amp_dtype", "on", "off", scope="main")
    assert found[(("--precision", "fp16"), ("--use_amp", True))] == (
        {TorchDtype("fp16")},
        {True},
        {False},
    )
    assert found[(("--precision", "fp32"), ("--use_amp", True))] == (
        {TorchDtype("bf16")},
        {False},
        {True},
    )
    assert found[(("--precision", "bf16"), ("--use_amp", False))][1:] == ({False}, {True})


def test_branches_getattr_and_an_unknowable_test():
    model = build(
        """
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
        args = parser.parse_args()
        if args.dtype == "bfloat16":
            use_scaler = False
        else:
            use_scaler = True
        compute_dtype = getattr(torch, args.dtype)
        fast = torch.cuda.is_available()
        """
    )
    found = values_of(model, "use_scaler", "compute_dtype", "fast")
    bf16, fp16 = ("--dtype", "bfloat16"), ("--dtype", "float16")
    assert found[(bf16, ("CUDA", True))] == ({False}, {TorchDtype("bf16")}, {True})
    assert found[(fp16, ("CUDA", False))] == ({True}, {TorchDtype("fp16")}, {False})


def test_the_machine_is_a_setting_every_value_of_which_is_a_default():
    model = build(
        """
        import torch

        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        dtype = "bfloat16" if bf16 else "float16"
        amp = torch.autocast("cuda")
        """
    )
    found = values_of(model, "dtype", "amp")
    # no bf16 support without CUDA; a CUDA autocast on such a machine is disabled
    assert found == {
        (("CUDA", True), ("bf16 support", True)): (
            {"bfloat16"},
            {AutocastValue("cuda", TorchDtype("fp16"), True)},
        ),
        (("CUDA", True), ("bf16 support", False)): (
            {"float16"},
            {AutocastValue("cuda", TorchDtype("fp16"), True)},
        ),
        (("CUDA", False), ("bf16 support", False)): (
            {"float16"},
            {AutocastValue("cuda", TorchDtype("fp16"), False)},
        ),
    }


def test_a_name_assigned_in_a_loop_or_augmented_is_unknown():
    model = build(
        """
        dtype = "float16"
        for attempt in range(3):
            dtype = pick(attempt)
        steps = 1
        steps += 1
        """
    )
    space = cv.joint(
        model,
        [
            (libcst.parse_expression("dtype"), model.scopes[0], 1 << 29),
            (libcst.parse_expression("steps"), model.scopes[0], 1 << 29),
        ],
    )
    assert space.knobs == []
    assert [r.values for r in space.rows] == [({cv.UNKNOWN}, {cv.UNKNOWN})]


def test_past_the_bound_the_answer_is_unknown_not_a_guess():
    flags = "\n".join(
        f'parser.add_argument("--f{i}", choices=["a", "b", "c", "d"], default="a")'
        for i in range(6)
    )
    model = build(
        "import argparse\nparser = argparse.ArgumentParser()\n"
        + flags
        + "\nargs = parser.parse_args()\n"
    )
    names = [f"args.f{i}" for i in range(6)]
    assert values_of(model, *names) is None  # 4**6 assignments


def test_conditions_name_the_setting_and_the_default():
    model = build(NANOGPT)
    top = model.scopes[0]
    space = cv.joint(model, [(libcst.parse_expression("scaler"), top, 1 << 29)])
    off = [r for r in space.rows if r.values[0] == {ScalerValue(False)}]
    on = [r for r in space.rows if r.values[0] == {ScalerValue(True)}]
    condition = space.condition(off, on)
    assert condition.affects_default  # 'bfloat16' is the default on a bf16 GPU
    assert condition.text == "with dtype='bfloat16' or dtype='float32'"
    assert condition.knobs == ("dtype",)
    assert space.condition(on, off).text == "with dtype='float16'"
