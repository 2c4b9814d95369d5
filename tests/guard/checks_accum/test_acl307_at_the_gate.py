"""ACL307 in user-style manual accumulation loops: a step gate without a last-batch clause over
a loader whose length is not a multiple of K is reported once, at the gate (where the linter
puts it and the fix goes), however many epochs leave a tail; a correct gate and a loader length
that is a multiple of K get nothing. Real CPU training steps, one process."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.utils import clip_grad_norm_

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import make_loader, make_model, mse, params_of, same  # noqa: E402

K = 4


def _line_of(function, marker: str) -> str:
    """'file:line' of the line of `function` that ends with the comment `# <marker>`."""
    lines, first = inspect.getsourcelines(function)
    [offset] = [i for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    return f"{inspect.getsourcefile(function)}:{first + offset}"


def plain_loop(model, opt, loader, epochs: int) -> None:
    for _ in range(epochs):
        for step, batch in enumerate(loader):  # loop
            loss = mse(model, batch) / K
            loss.backward()
            if (step + 1) % K == 0:  # gate
                opt.step()
                opt.zero_grad()


def correct_loop(model, opt, loader, epochs: int) -> None:
    for _ in range(epochs):
        for step, batch in enumerate(loader):
            (mse(model, batch) / K).backward()
            if (step + 1) % K == 0 or step + 1 == len(loader):
                opt.step()
                opt.zero_grad()


def train_one_epoch(model, opt, loader) -> None:
    """The gate bound to a name, the step in a helper, a clip nested in the gate."""
    for i, batch in enumerate(loader):
        update = (i + 1) % K == 0  # named gate
        (mse(model, batch) / K).backward()
        if update:
            if len(opt.param_groups) == 1:  # an `if` inside the gate is not the gate
                clip_grad_norm_(model.parameters(), 1.0)
                _step(opt)


def _step(opt) -> None:
    opt.step()
    opt.zero_grad()


def _finish() -> None:
    from guard._tracker import TRACKER

    TRACKER.emit("finish")


def _setup(batches: int):
    model = make_model()
    return model, torch.optim.SGD(model.parameters(), lr=0.05), make_loader(batches)


def test_three_epochs_of_tails_are_one_finding_at_the_gate(guard_on):
    guard_on.configure(mode="warn")
    model, opt, loader = _setup(batches=10)
    plain_loop(model, opt, loader, epochs=3)
    _finish()
    [finding] = guard_on.findings()
    assert (finding.code, finding.level, finding.count) == ("ACL307", "error", 1)
    assert finding.location == _line_of(plain_loop, "gate")
    loop_line = _line_of(plain_loop, "loop").rpartition(":")[2]
    assert f"the pass over the loader at line {loop_line} ended (10 batches) with 2 " in (
        finding.message
    )
    assert "leaks into this step's window" in finding.message


def test_raise_mode_stops_the_leaking_step_at_the_gate(guard_on):
    model, opt, loader = _setup(batches=10)
    plain_loop(model, opt, loader, epochs=1)
    after_first_epoch = params_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        plain_loop(model, opt, loader, epochs=1)
    assert info.value.code == "ACL307"
    assert info.value.location == _line_of(plain_loop, "gate")
    assert same(params_of(model), after_first_epoch)  # the 6-micro-batch step never ran


def test_a_single_epochs_lost_tail_is_a_warning_at_the_gate_when_the_run_ends(guard_on):
    model, opt, loader = _setup(batches=10)
    plain_loop(model, opt, loader, epochs=1)
    assert guard_on.findings() == []  # the window may still go on: nothing to say yet
    _finish()
    [finding] = guard_on.findings()
    assert (finding.code, finding.level, finding.count) == ("ACL307", "warning", 1)
    assert finding.location == _line_of(plain_loop, "gate")
    assert "is lost: the run ended" in finding.message


def test_a_named_gate_in_a_helper_points_at_the_gates_assignment(guard_on):
    """The step is made in `_step`, called under an `if` nested in `if update:`: the gate is the
    `update = ...` line, as the linter says."""
    guard_on.configure(mode="warn")
    model, opt, loader = _setup(batches=10)
    for _ in range(3):
        train_one_epoch(model, opt, loader)
    _finish()
    [finding] = guard_on.findings()
    assert (finding.code, finding.count) == ("ACL307", 1)
    assert finding.location == _line_of(train_one_epoch, "named gate")


@pytest.mark.parametrize(
    ("loop", "batches"),
    [(correct_loop, 10), (plain_loop, 12), (correct_loop, 12)],
    ids=["last-batch-clause", "length-multiple-of-K", "both"],
)
def test_must_not_flag_a_correct_gate_or_a_length_that_is_a_multiple_of_k(guard_on, loop, batches):
    model, opt, loader = _setup(batches)
    loop(model, opt, loader, epochs=3)
    _finish()
    assert guard_on.findings() == []
