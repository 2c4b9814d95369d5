"""Raise mode as a user reads it: the GuardError's traceback ends at the user's line (from a plain
loop, from Accelerate and from guard.Engine), the message is `path:line: CODE ...` then `help:`,
and `python -m guard` prints it that way and exits 1. ACCEL_GUARD_DEBUG=1 keeps every frame."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
HERE = __file__


def _last_frame(error: BaseException) -> tuple[str, int]:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return frame.filename, frame.lineno


def _line_of(marker: str) -> int:
    """The line of this file that holds `marker` in a comment."""
    lines = Path(HERE).read_text(encoding="utf-8").splitlines()
    return 1 + next(i for i, line in enumerate(lines) if line.endswith(f"# {marker}"))


def _ungated_scheduler_loop() -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    for i in range(4):
        model(torch.randn(2, 4)).sum().backward()
        if (i + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()
        sched.step()  # plain-sched


def test_plain_loop_error_ends_at_the_users_line(guard_mode):
    guard = guard_mode("raise")
    with pytest.raises(guard.GuardError) as info:
        _ungated_scheduler_loop()
    line = _line_of("plain-sched")
    assert _last_frame(info.value) == (HERE, line)
    first, help_line = str(info.value).splitlines()
    assert first.startswith(f"{os.path.relpath(HERE)}:{line}: ACL305 StepLR.step() runs ")
    assert help_line.startswith("help: step the scheduler in the branch that steps the optimizer")
    assert help_line.endswith("(accel-lint --explain ACL305)")
    assert (info.value.code, info.value.location) == ("ACL305", f"{HERE}:{line}")


def test_debug_keeps_the_guards_frames(guard_mode, monkeypatch):
    guard = guard_mode("raise")
    monkeypatch.setenv("ACCEL_GUARD_DEBUG", "1")
    with pytest.raises(guard.GuardError) as info:
        _ungated_scheduler_loop()
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename.endswith(os.path.join("guard", "_report.py"))
    assert any(f.filename.endswith("acl305_ungated_scheduler_step.py") for f in frames)
    assert (frames[-1].filename, frames[-1].lineno) != (HERE, _line_of("plain-sched"))


def test_engine_error_ends_at_the_users_line(guard_mode):
    guard = guard_mode("raise")
    engine = guard.Engine(gradient_accumulation_steps=4, device="cpu")
    model = torch.nn.Linear(4, 1)
    model, opt = engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(guard.GuardError) as info:
        engine.backward(model(torch.randn(2, 4)).sum())  # engine-backward
    assert info.value.code == "ACL306"
    assert _last_frame(info.value) == (HERE, _line_of("engine-backward"))


def test_accelerate_error_ends_at_the_users_line(guard_mode):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    guard = guard_mode("raise")
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = torch.nn.Linear(4, 1)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.randn(2, 4)).sum())  # outside accumulate()
    with pytest.raises(guard.GuardError) as info:
        opt.step()  # accelerate-step
    assert info.value.code == "ACL306"
    assert _last_frame(info.value) == (HERE, _line_of("accelerate-step"))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert not any(os.sep + "accelerate" + os.sep in f.filename for f in frames)


def test_python_m_guard_prints_the_script_frames_and_exits_1():
    """An Accelerate fixture run as users run it: the traceback holds the script's frames only,
    down to the `optimizer.step()` the guard stopped before it ran (line 29)."""
    script = ROOT / "fixtures" / "ACL306" / "bad_accelerate_no_accumulate.py"
    env = {**os.environ, "ACCEL_GUARD": "raise", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "guard", str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    frames = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("File")]
    assert frames == [f'File "{script}", line 29, in <module>'], proc.stderr
    first, help_line = proc.stderr.strip().splitlines()[-2:]
    assert first.startswith(f"guard.GuardError: {script.relative_to(ROOT)}:29: ACL306 ")
    assert help_line.startswith("help: ") and help_line.endswith("(accel-lint --explain ACL306)")


def test_a_guard_error_survives_pickling(guard_mode):
    import pickle

    guard = guard_mode("raise")
    error = guard.GuardError("ACL305", "a problem; the fix", "train.py:3")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.message, copy.location, str(copy)) == (
        "ACL305",
        "a problem; the fix",
        "train.py:3",
        "train.py:3: ACL305 a problem\nhelp: the fix (accel-lint --explain ACL305)",
    )
