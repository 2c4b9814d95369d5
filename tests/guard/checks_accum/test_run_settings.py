"""The run's settings as the guard sees them: a finding caused by K or the precision names the
non-default command-line setting of this run that makes it bite (against the parser's own
defaults), and the run report lists every setting. Real CPU training steps."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import make_loader, make_model, mse  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def make_parser() -> argparse.ArgumentParser:
    """A fine-tuning script's flags, as HF's *_no_trainer.py examples write them."""
    parser = argparse.ArgumentParser(description="Finetune a regressor")
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument(
        "--gradient_accumulation_steps",
        type=int,
        default=1,
        help="Number of updates steps to accumulate before performing a backward/update pass.",
    )
    parser.add_argument(
        "--dtype", type=str, default="bfloat16", choices=["float32", "bfloat16", "float16"]
    )
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--seed", type=int, default="42")
    return parser


def train_undivided(args) -> None:
    """Accumulates K micro-batches per step, forgetting to divide the loss by K."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    for step, batch in enumerate(make_loader()):
        loss = mse(model, batch)
        loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()


def test_a_k_finding_names_the_flag_this_run_set(guard_on):
    parser = make_parser()
    args = parser.parse_args(["--gradient_accumulation_steps", "4", "--learning_rate", "0.01"])
    train_undivided(args)
    [finding] = guard_on.findings()
    assert finding.code == "ACL301"
    default = parser.get_default("gradient_accumulation_steps")
    assert (
        "(4x the large-batch mean); this run sets `--gradient_accumulation_steps 4` "
        f"(default {default}), the setting under which it bites; divide each loss by"
    ) in finding.message
    from guard import _voice

    problem, fix = _voice.split_fix("ACL301", finding.message)  # the help: line keeps the fix
    assert fix.startswith("divide each loss by the accumulation steps")
    assert "learning_rate" not in finding.message  # changed, but not what K findings depend on


def test_a_k_at_its_default_says_nothing_about_settings(guard_on):
    parser = make_parser()
    parser.set_defaults(gradient_accumulation_steps=4)  # the script's own default is 4
    train_undivided(parser.parse_args([]))
    [finding] = guard_on.findings()
    assert finding.code == "ACL301"
    assert "this run sets" not in finding.message


def test_a_precision_finding_names_the_dtype_flag(guard_on):
    parser = make_parser()
    args = parser.parse_args(["--dtype", "float16"])
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        args.dtype
    ]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in make_loader(batches=2):
        with torch.autocast("cpu", dtype=ptdtype):
            loss = mse(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    [finding] = [f for f in guard_on.findings() if f.code == "ACL106"]
    default = parser.get_default("dtype")
    assert f"this run sets `--dtype float16` (default {default})" in finding.message


def test_the_run_report_lists_the_settings_against_the_parsers_defaults(guard_on):
    from guard.run_report import config

    parser = make_parser()
    parser.parse_args(["--gradient_accumulation_steps", "4", "--with_tracking"])
    rows = {r["name"]: r for r in config._settings()}
    assert rows["gradient_accumulation_steps"] == {
        "name": "gradient_accumulation_steps",
        "option": "--gradient_accumulation_steps",
        "value": 4,
        "default": parser.get_default("gradient_accumulation_steps"),
        "source": "argparse",
        "changed": True,
    }
    assert rows["with_tracking"]["changed"] and rows["with_tracking"]["default"] is False
    # a string default goes through `type=` as argparse does: 42, unchanged
    assert (rows["seed"]["value"], rows["seed"]["default"], rows["seed"]["changed"]) == (
        42,
        42,
        False,
    )
    assert not rows["learning_rate"]["changed"]
    assert "help" not in rows


def test_recording_never_runs_a_type_that_acts(guard_on, tmp_path):
    """`type=argparse.FileType("w")` opens its file: only int/float defaults are converted."""
    parser = argparse.ArgumentParser()
    untouched = tmp_path / "default.log"
    parser.add_argument("--log", type=argparse.FileType("w"), default=str(untouched))
    args = parser.parse_args(["--log", str(tmp_path / "given.log")])
    args.log.close()
    assert not untouched.exists()


def test_an_accelerator_built_with_another_k_is_not_the_flags_doing(guard_on):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from guard import _run_settings

    parser = make_parser()
    parser.parse_args(["--gradient_accumulation_steps", "4"])
    try:
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        assert _run_settings.causes("ACL301") == []
        del accelerator
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
        [cause] = _run_settings.causes("ACL301")  # the flag is what built this Accelerator
        assert cause.given() == "--gradient_accumulation_steps 4"
        assert accelerator.gradient_accumulation_steps == 4
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def test_a_precision_flag_is_named_when_the_accelerator_runs_it(guard_on):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from guard import _run_settings

    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])
    args = parser.parse_args(["--mixed_precision", "bf16"])
    try:
        accelerator = Accelerator(cpu=True, mixed_precision=args.mixed_precision)
        [cause] = _run_settings.causes("ACL105")
        assert (cause.given(), cause.default_text()) == ("--mixed_precision bf16", "default no")
        assert _run_settings.causes("ACL301") == []  # not what accumulation findings need
        assert accelerator.mixed_precision == "bf16"
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def test_uninstall_restores_argparse():
    import guard

    guard.uninstall()
    original = argparse.ArgumentParser.parse_known_args
    guard.install()
    assert argparse.ArgumentParser.parse_known_args is not original
    guard.uninstall()
    assert argparse.ArgumentParser.parse_known_args is original


NANOGPT = """
import sys

import torch
from torch import nn

gradient_accumulation_steps = 1
learning_rate = 0.01
# nanoGPT's configurator.py, inlined: --key=value overrides a global
for arg in sys.argv[1:]:
    key, val = arg[2:].split("=")
    globals()[key] = type(globals()[key])(val)

world_size = 2  # nanoGPT: gradient_accumulation_steps //= ddp_world_size
gradient_accumulation_steps //= world_size
torch.manual_seed(0)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
for it in range(8):
    x = torch.randn(4, 8)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    loss.backward()
    if (it + 1) % gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
"""


def test_a_nanogpt_configurator_override_under_python_m_guard(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(NANOGPT))
    proc = subprocess.run(
        [sys.executable, "-m", "guard", str(script), "--gradient_accumulation_steps=4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "ACCEL_GUARD": "warn"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 micro-batches contributed" in proc.stderr  # 4 // 2 per process
    assert (  # what the command line set, not the global after the division
        "this run sets `--gradient_accumulation_steps=4` (default 1), the setting under which "
        "it bites"
    ) in proc.stderr
