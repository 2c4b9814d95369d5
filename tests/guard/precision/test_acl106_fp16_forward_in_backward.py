"""ACL106 judges the backward, not the autocast region: only an fp16 forward whose graph the
unscaled backward runs through is fp16 training without a scaler."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

HERE = "test_acl106_fp16_forward_in_backward.py:"


def _student_and_teacher():
    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    teacher = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).requires_grad_(False)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    return student, teacher, optimizer, torch.randn(16, 8)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _distill(student, teacher, optimizer, x, student_dtype=None, steps: int = 3) -> None:
    """Distillation steps: the frozen teacher under fp16 autocast with grad mode on."""
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            soft = teacher(x)
        assert soft.dtype == torch.float16 and soft.grad_fn is None
        dtype, enabled = student_dtype or torch.float32, student_dtype is not None
        with torch.autocast("cpu", dtype=dtype, enabled=enabled):
            logits = student(x)
        loss = F.kl_div(logits.float().log_softmax(-1), soft.float().softmax(-1), reduction="sum")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_fp16_training_without_scaler_is_reported_at_the_backward(guard_on):
    """Judged at the step (a GradScaler stepping the optimizer would make it ACL101's), named
    after the backward's line and step."""
    student, _, optimizer, x = _student_and_teacher()
    before = _params(student)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = student(x).float().square().mean()
    loss.backward()
    backward_line = f"{HERE}{sys._getframe().f_lineno - 1}"
    assert guard_on.findings() == []
    optimizer.step()  # a warning: the loop goes on in raise mode
    (finding,) = guard_on.findings()
    assert (finding.code, finding.level, finding.step) == ("ACL106", "warning", 0)
    assert finding.location.endswith(backward_line)
    assert HERE in finding.message  # names the autocast region
    assert not all(torch.equal(a, b) for a, b in zip(before, _params(student), strict=True))


def _raw_backward_with_scaler(steps: int, scaled_main_loss: bool) -> None:
    """fp16 forward, a raw `loss.backward()` (beside a scaled main loss, or alone), then the
    scaler's unscale, step and update."""
    student, _, optimizer, x = _student_and_teacher()
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            out = student(x)
        if scaled_main_loss:
            scaler.scale(out.float().square().mean()).backward(retain_graph=True)
        out.float().abs().mean().backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def test_raw_backward_beside_a_scaled_loss_is_acl101_only(guard_on):
    """One root cause (the backward skipped the loop's scaler), one finding."""
    guard_on.configure(mode="warn")
    _raw_backward_with_scaler(steps=3, scaled_main_loss=True)
    assert sorted({f.code for f in guard_on.findings()}) == ["ACL101"]


def test_raw_backward_never_scaled_raises_acl101_only(guard_on):
    with pytest.raises(guard_on.GuardError) as raised:
        _raw_backward_with_scaler(steps=1, scaled_main_loss=False)
    assert raised.value.code == "ACL101"
    from guard._tracker import TRACKER

    TRACKER.emit("finish")  # the run ends: nothing else is reported for that backward
    assert [f.code for f in guard_on.findings()] == ["ACL101"]


def test_frozen_fp16_teacher_with_fp32_student_is_silent(guard_on):
    student, teacher, optimizer, x = _student_and_teacher()
    _distill(student, teacher, optimizer, x)
    assert guard_on.findings() == []


def test_frozen_fp16_teacher_with_bf16_student_is_silent(guard_on):
    student, teacher, optimizer, x = _student_and_teacher()
    reference, ref_teacher, ref_opt, _ = _student_and_teacher()
    guard_on.configure(mode="off")
    _distill(reference, ref_teacher, ref_opt, x, torch.bfloat16)
    guard_on.configure(mode="raise")
    _distill(student, teacher, optimizer, x, torch.bfloat16)
    assert guard_on.findings() == []
    assert all(torch.equal(a, b) for a, b in zip(_params(student), _params(reference), strict=True))


def test_fp16_evaluation_with_grad_enabled_but_never_backpropagated_is_silent(guard_on):
    student, _, optimizer, x = _student_and_teacher()
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.float16):
            val = student(x)  # grad mode on: a graph is recorded, never used
        assert val.dtype == torch.float16 and val.grad_fn is not None
        optimizer.zero_grad()
        student(x).square().mean().backward()  # fp32 training
        optimizer.step()
    assert guard_on.findings() == []


def test_gradient_through_a_frozen_fp16_network_is_reported(guard_on):
    """A frozen fp16 critic fed the student's output (a perceptual loss): the student's gradient
    flows back through fp16 activations, so it can underflow."""
    student, teacher, optimizer, x = _student_and_teacher()
    critic = nn.Linear(4, 1).requires_grad_(False)
    out = student(x)
    with torch.autocast("cpu", dtype=torch.float16):
        score = critic(out)
    score.float().mean().backward()
    optimizer.step()  # judged at the step: no GradScaler steps the student
    assert [f.code for f in guard_on.findings()] == ["ACL106"]


def test_fp16_training_with_a_grad_scaler_is_silent(guard_on):
    student, _, optimizer, x = _student_and_teacher()
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = student(x).float().square().mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    assert guard_on.findings() == []


def _engine_with(precision: str):
    from guard.engine import Engine

    engine = Engine(precision)
    student, _, optimizer, x = _student_and_teacher()
    student, optimizer = engine.prepare(student, optimizer)
    return engine, student, optimizer, x


def test_engine_refuses_an_unscaled_fp16_backward_before_autograd_runs(guard_on):
    engine, student, optimizer, x = _engine_with("no")
    with torch.autocast("cpu", dtype=torch.float16):  # the user's own region, no scaler
        loss = student(x).float().square().mean()
    with pytest.raises(guard_on.GuardError) as info:
        engine.backward(loss)
    assert info.value.code == "ACL106"
    assert all(p.grad is None for p in student.parameters())


def test_engine_in_fp16_scales_and_is_silent(guard_on):
    engine, student, optimizer, x = _engine_with("fp16")
    start = _params(student)
    for _ in range(2):
        with engine.autocast():
            loss = student(x).float().square().mean()
        engine.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    assert guard_on.findings() == []
    assert not all(torch.equal(a, b) for a, b in zip(start, _params(student), strict=True))


def test_raw_backward_through_the_engines_fp16_forward_is_only_acl101(guard_on):
    """The engine's forward runs under its fp16 autocast and its scaler exists: bypassing
    engine.backward is ACL101 (no 1/N, no scaling), reported once, not also as ACL106."""
    engine, student, optimizer, x = _engine_with("fp16")
    guard_on.configure(mode="warn")
    loss = student(x).float().square().mean()
    loss.backward()
    assert [f.code for f in guard_on.findings()] == ["ACL101"]
