"""ACL310 judged at each real optimizer step: a schedule that runs out while training goes on is
reported during training (not at exit), in Accelerate and guard.Engine loops, with one process
and with W=2 (the two-rank worker); the catalogue's must-not-flag loops stay clean to the end."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N, EPOCHS = 2, 3


def _loader(batches: int) -> DataLoader:
    data = torch.randn(batches * 4, 8, generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(data, data.sum(1, keepdim=True)), batch_size=4)


def _model_and_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _accelerate(make_scheduler, batches: int = 8, n: int = N):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=n)
    model, opt = _model_and_optimizer()
    loader = _loader(batches)
    sched = make_scheduler(opt, len(loader))  # sized from the unprepared loader
    return (accelerator, *accelerator.prepare(model, opt, loader, sched))


def _acl310(guard_module) -> list:
    return [f for f in guard_module.findings() if f.code == "ACL310"]


def _train(runner, model, opt, loader, sched, *, per="step", max_steps=None) -> int | None:
    """Accelerate's accumulation loop; returns the optimizer step at which ACL310 appeared."""
    import guard

    steps, reported_at = 0, None
    for _ in range(EPOCHS):
        for x, y in loader:
            with runner.accumulate(model):
                runner.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                if per == "step":
                    sched.step()
                opt.zero_grad()
            steps += int(runner.sync_gradients)
            if reported_at is None and _acl310(guard):
                reported_at = steps
            if max_steps is not None and steps >= max_steps:
                return reported_at  # a step budget stops training mid-epoch
        if per == "epoch":
            sched.step()
        elif per == "plateau":
            sched.step(1.0)
    return reported_at


def _finish() -> None:
    from guard._tracker import TRACKER

    TRACKER.emit("finish")


@pytest.fixture
def all_codes(guard_on):
    guard_on.configure(select=["ACL"])
    return guard_on


def test_acl310_schedule_without_the_epochs_is_reported_while_training(all_codes):
    """Sized for one epoch (ceil(8 / 2) = 4 optimizer steps) of a 3-epoch run: the one-cycle
    schedule is over after step 4, and reported once training has run 1.5x as long."""
    accelerator, model, opt, loader, sched = _accelerate(
        lambda o, length: torch.optim.lr_scheduler.OneCycleLR(
            o, 0.05, total_steps=math.ceil(length / N)
        )
    )
    reported_at = _train(accelerator, model, opt, loader, sched)
    assert reported_at == 7  # of 12: during training, not at exit
    [finding] = _acl310(all_codes)
    assert finding.level == "warning"
    assert "built for 4 steps and ran out after 4 optimizer steps" in finding.message
    assert "test_acl310_per_step.py" in finding.location  # where the scheduler was prepared


def _linear_with_warmup(step: int, warmup: int, total: int) -> float:
    """The factor of transformers' get_linear_schedule_with_warmup (a LambdaLR: opaque length)."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def test_acl310_lambda_schedule_at_its_floor_is_reported_in_an_engine_loop(all_codes):
    from guard import Engine

    engine = Engine(gradient_accumulation_steps=N)
    model, opt = _model_and_optimizer()
    loader = _loader(8)
    per_epoch = math.ceil(len(loader) / N)
    factor = functools.partial(_linear_with_warmup, warmup=1, total=per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    model, opt, loader, sched = engine.prepare(model, opt, loader, sched)
    assert _train(engine, model, opt, loader, sched) == 7
    [finding] = _acl310(all_codes)
    assert "LambdaLR was built for 4 steps and ran out after 4 optimizer steps" in finding.message


def _one_cycle_for_the_run(o, length):
    return torch.optim.lr_scheduler.OneCycleLR(o, 0.05, total_steps=math.ceil(length / N) * EPOCHS)


MUST_NOT_FLAG = {
    "optimizer_steps": (_one_cycle_for_the_run, "step", 8, None),
    "per_epoch": (
        lambda o, _: torch.optim.lr_scheduler.CosineAnnealingLR(o, EPOCHS),
        "epoch",
        8,
        None,
    ),
    "plateau": (lambda o, _: torch.optim.lr_scheduler.ReduceLROnPlateau(o), "plateau", 8, None),
    "warmup_linear": (
        lambda o, _: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=2),
        "step",
        8,
        None,
    ),
    "warmup_lambda": (
        lambda o, _: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3)),
        "step",
        8,
        None,
    ),
    "max_steps": (_one_cycle_for_the_run, "step", 8, 5),  # stops mid-epoch 2 of 3
    "floor_instead_of_ceil": (  # 9 batches, N=4: 3 optimizer steps per epoch, sized for 2
        lambda o, length: torch.optim.lr_scheduler.OneCycleLR(
            o, 0.05, total_steps=length // 4 * EPOCHS
        ),
        "step",
        9,
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(MUST_NOT_FLAG))
def test_acl310_must_not_flag(all_codes, case):
    make_scheduler, per, batches, max_steps = MUST_NOT_FLAG[case]
    n = 4 if case == "floor_instead_of_ceil" else N
    accelerator, model, opt, loader, sched = _accelerate(make_scheduler, batches, n)
    _train(accelerator, model, opt, loader, sched, per=per, max_steps=max_steps)
    _finish()
    assert _acl310(all_codes) == []


def test_acl310_far_short_is_still_judged_at_the_end_of_a_finished_run(all_codes):
    """The catalogue's micro-batch mistake under N=4: only the end of the run can show it."""
    accelerator, model, opt, loader, sched = _accelerate(
        lambda o, length: torch.optim.lr_scheduler.OneCycleLR(o, 0.05, total_steps=length * EPOCHS),
        n=4,
    )
    assert _train(accelerator, model, opt, loader, sched) is None  # nothing during training
    _finish()
    [finding] = _acl310(all_codes)
    assert "built for 24 steps but training ended at step 6 (25% of the schedule)" in (
        finding.message
    )
    assert "6 x K=4 = 24: the length looks counted in micro-batches" in finding.message


def test_acl310_with_two_processes_per_process_length_is_reported_during_training(two_ranks):
    for rank in two_ranks:
        bad, good = rank["schedule_per_process"], rank["schedule_global"]
        assert bad["reported_at"] == 7 and bad["steps"] == 8  # before the run ended
        [(code, level, message)] = bad["findings"]
        assert (code, level) == ("ACL310", "warning")
        assert "steps 2x per optimizer step with 2 processes" in message
        assert good["findings"] == [] and good["steps"] == 8


def test_acl310_a_scheduler_built_mid_run_counts_from_its_own_start(all_codes):
    """A second phase: 4 optimizer steps without a schedule, then one sized for 2 of the
    remaining 8 steps; it ran out after 2 of its own steps, reported at its 4th (run step 8)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=N)
    model, opt = _model_and_optimizer()
    model, opt, loader = accelerator.prepare(model, opt, _loader(8))
    steps, reported_at = 0, None
    sched = None
    for epoch in range(EPOCHS):
        if epoch == 1:
            sched = accelerator.prepare(
                torch.optim.lr_scheduler.OneCycleLR(opt, 0.05, total_steps=2)
            )
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                if sched is not None:
                    sched.step()
                opt.zero_grad()
            steps += int(accelerator.sync_gradients)
            if reported_at is None and _acl310(all_codes):
                reported_at = steps
    assert reported_at == 8
    [finding] = _acl310(all_codes)
    assert "ran out after 2 optimizer steps, but training goes on (2 steps so far)" in (
        finding.message
    )
