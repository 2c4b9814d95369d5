"""The guard's checks still see a drop-in loop correctly: saving and loading through the new
methods, inside the accumulation window included, gives no finding; and the linter's ACL503
counts `engine.save_state(...)` as a checkpoint that holds the scaler."""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch
from dropin_reference import Counter, flat_params, setup, train

import guard
from linter.analysis import analyze_source

N = 4


@pytest.fixture
def every_check():
    """The guard installed in raise mode with every code selected; settings restored after."""
    from guard import _report

    guard.install()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="raise", select=("ACL",))
    guard.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", guard.GuardWarning)  # advice counts as a finding too
        yield
    guard.reset()
    _report._state.settings = saved


@pytest.mark.parametrize("stop", [5, 6, 7])  # 1, 2 and 3 micro-steps into the second window
def test_checkpoint_inside_the_window_and_resume_raise_nothing(every_check, tmp_path, stop):
    engine = guard.Engine("fp16", gradient_accumulation_steps=N)
    counter = Counter()
    engine.register_for_checkpointing(counter)
    model, opt, loader, sched = setup(engine)
    for i, (xb, yb) in enumerate(loader):
        with engine.accumulate(model):
            engine.backward(torch.nn.functional.mse_loss(model(xb), yb))
            if i + 1 == stop:  # mid-window, inside the accumulate block, before the step
                engine.save_state(tmp_path)
            opt.step()
            sched.step()
            opt.zero_grad()
        counter.seen += 1
    expected = flat_params(model)

    resumed = guard.Engine("fp16", gradient_accumulation_steps=N)
    resumed.register_for_checkpointing(Counter())
    model, opt, loader, sched = setup(resumed, seed=3)
    resumed.load_state(tmp_path)
    with resumed.main_process_first():
        train(resumed, model, opt, resumed.skip_first_batches(loader, stop), sched, clip=None)
    assert guard.findings() == []
    assert torch.equal(flat_params(model), expected)  # the saved micro-step is not repeated


def test_free_memory_then_a_second_training_raises_nothing(every_check):
    engine = guard.Engine(gradient_accumulation_steps=N)
    model, opt, loader, sched = setup(engine, samples=32)
    train(engine, model, opt, loader, sched)
    model, opt = engine.free_memory(model, opt)
    engine.gradient_accumulation_steps = 2
    model, opt, loader, sched = setup(engine, samples=32)
    train(engine, model, opt, loader, sched)
    assert guard.findings() == [] and engine.optimizer_steps == 4  # counted from free_memory


def _acl503(source: str) -> list[tuple[str, int]]:
    diagnostics = analyze_source(textwrap.dedent(source), "train.py", ["ACL503"])
    return [(d.code, d.start.line) for d in diagnostics]


ENGINE_SETUP = """
import torch
import guard

engine = guard.Engine(mixed_precision="fp16", gradient_accumulation_steps=4)
scaler = torch.amp.GradScaler("cuda")
model, opt = engine.prepare(model, torch.optim.AdamW(model.parameters()))
"""


def test_acl503_counts_save_state_as_a_complete_checkpoint():
    assert _acl503(ENGINE_SETUP + 'engine.save_state("checkpoints/step_100")\n') == []


def test_acl503_still_reports_a_torch_save_next_to_it():
    source = ENGINE_SETUP + (
        'engine.save_state("checkpoints/step_100")\n'
        'torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, "last.pt")\n'
    )
    assert _acl503(source) == [("ACL503", 9)]


def test_acl503_sees_an_engine_passed_to_a_helper():
    source = """
    import torch
    import guard

    scaler = torch.amp.GradScaler("cuda")

    def checkpoint(trainer: guard.Engine, folder):
        trainer.save_state(folder)
    """
    assert _acl503(source) == []
