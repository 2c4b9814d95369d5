"""ACL306 in user-style Accelerate loops: `Accelerator(gradient_accumulation_steps=K)`, a loop
that calls `accelerator.backward(loss)` (itself or in a helper) and steps every batch without
ever entering `accumulate()`. One finding, at the loop's step, naming the backward's line; the
run is what the finding says (every batch steps on 1/K of its gradient), compared with a plain
reference loop. The same helper inside `accumulate()` gets nothing and trains like manual
accumulation. Real CPU training steps, one process."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import make_loader, make_model, mse, params_of, same  # noqa: E402

K = 4
EPOCHS = 2
BATCHES = 8
LR = 0.05


def _line_of(function, marker: str) -> str:
    """'file:line' of the line of `function` that ends with the comment `# <marker>`."""
    lines, first = inspect.getsourcelines(function)
    [offset] = [i for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    return f"{inspect.getsourcefile(function)}:{first + offset}"


def _prepared():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    return accelerator, *accelerator.prepare(model, opt, make_loader(BATCHES))


def train_step(accelerator, model, batch) -> None:
    loss = mse(model, batch)
    accelerator.backward(loss)  # helper backward


def loop_with_a_helper(accelerator, model, opt, loader) -> None:
    for _ in range(EPOCHS):
        for batch in loader:
            train_step(accelerator, model, batch)
            opt.step()  # loop step
            opt.zero_grad()


def loop_without_a_helper(accelerator, model, opt, loader) -> None:
    for batch in loader:
        accelerator.backward(mse(model, batch))
        opt.step()  # direct step
        opt.zero_grad()


def loop_inside_accumulate(accelerator, model, opt, loader) -> None:
    for _ in range(EPOCHS):
        for batch in loader:
            with accelerator.accumulate(model):
                train_step(accelerator, model, batch)
                opt.step()
                opt.zero_grad()


def _reference(step_every: int) -> list[torch.Tensor]:
    """A plain loop, no Accelerate: each loss divided by K, a step every `step_every` batches."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(EPOCHS):
        for i, batch in enumerate(make_loader(BATCHES)):
            (mse(model, batch) / K).backward()
            if (i + 1) % step_every == 0:
                opt.step()
                opt.zero_grad()
    return params_of(model)


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(u, v, rtol=1e-6, atol=1e-7) for u, v in zip(a, b, strict=True))


def test_a_backward_in_a_helper_gives_one_finding_at_the_loops_step(guard_on):
    guard_on.configure(mode="warn")
    accelerator, model, opt, loader = _prepared()
    loop_with_a_helper(accelerator, model, opt, loader)
    [finding] = guard_on.findings()
    assert (finding.code, finding.level, finding.count) == ("ACL306", "error", 1)
    assert finding.location == _line_of(loop_with_a_helper, "loop step")
    assert (
        "this optimizer step uses 1 backward pass(es) made outside accelerator.accumulate() "
        f"(the first at {_line_of(train_step, 'helper backward')}), each divided by 4: the "
        "update is 1/4 of the intended gradient"
    ) in finding.message
    # what the finding says is what ran: a step on every batch with 1/K of its gradient
    assert _close(params_of(model), _reference(step_every=1))
    assert not _close(params_of(model), _reference(step_every=K))


def test_raise_mode_stops_the_first_step_before_it_changes_a_parameter(guard_on):
    accelerator, model, opt, loader = _prepared()
    before = params_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        loop_without_a_helper(accelerator, model, opt, loader)
    assert info.value.code == "ACL306"
    assert info.value.location == _line_of(loop_without_a_helper, "direct step")
    assert same(before, params_of(model))


def test_must_not_flag_the_same_helper_inside_accumulate(guard_on):
    accelerator, model, opt, loader = _prepared()
    loop_inside_accumulate(accelerator, model, opt, loader)
    assert guard_on.findings() == []
    assert _close(params_of(model), _reference(step_every=K))


def test_an_entry_refused_by_another_check_does_not_blind_it_later(guard_on):
    """ACL309 refuses a second accumulate() entry for one batch (a notebook cell, caught); that
    entry never opened, so a later Accelerator's loop without accumulate() is still judged."""
    from accelerate.state import AcceleratorState, GradientState

    accelerator, model, opt, loader = _prepared()
    batch = next(iter(loader))
    with accelerator.accumulate(model):
        mse(model, batch)
    with pytest.raises(guard_on.GuardError) as refused:
        with accelerator.accumulate(model):
            pass
    assert refused.value.code == "ACL309"
    AcceleratorState._reset_state(True)  # the next cell builds a new Accelerator
    GradientState._reset_state()
    with pytest.raises(guard_on.GuardError) as info:
        loop_without_a_helper(*_prepared())
    assert info.value.code == "ACL306"
