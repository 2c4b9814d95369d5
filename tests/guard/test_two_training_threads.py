"""Two threads training two models at the same time in one process: each thread's backward
passes, autocast regions and steps are its own, so correct loops get no finding (the guard once
counted one thread's backward for the other's optimizer: false ACL303/ACL304), and the guard
changes no number (each model equals the same loop run alone without the guard)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

K = 2
STEPS = 40


# Each thread draws from its own generator: torch's global one is shared by the threads.
def _batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)) for _ in range(STEPS)
    ]


def _model(seed: int) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def train_amp_accumulating(seed: int, in_step=lambda: None) -> list[torch.Tensor]:
    """fp16 autocast, a GradScaler, K-step accumulation, unscale and clip on the update step."""
    model = _model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, y) in enumerate(_batches(seed)):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), y) / K
        in_step()  # both threads start their backward together
        scaler.scale(loss).backward()
        if (i + 1) % K == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def train_fp32_zero_grad_first(seed: int, in_step=lambda: None) -> list[torch.Tensor]:
    """fp32, zero_grad at the top of every iteration, one backward and one step each."""
    model = _model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    for x, y in _batches(seed):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        in_step()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Two Python threads share torch's intra-op pool, whose split of a reduction then varies
    from run to run: one thread each keeps every sum in the same order, so "trains exactly as
    alone" compares the guard's effect only."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def guard_all_codes():
    import guard
    from guard import _report

    guard.uninstall()
    guard.install()
    saved = _report._state.settings
    _report._state.settings = _report._Settings(mode="raise", select=("ACL",))
    guard.reset()
    yield guard
    guard.reset()
    _report._state.settings = saved


@pytest.mark.parametrize(
    "loops",
    [
        (train_amp_accumulating, train_amp_accumulating),
        (train_amp_accumulating, train_fp32_zero_grad_first),
    ],
    ids=["amp-and-amp", "amp-and-fp32"],
)
def test_two_threads_at_once_get_no_finding_and_train_as_alone(guard_all_codes, loops):
    guard_all_codes.uninstall()
    references = [loop(seed) for seed, loop in enumerate(loops)]  # alone, without the guard
    guard_all_codes.install()
    guard_all_codes.reset()
    barrier = threading.Barrier(len(loops))  # each backward of one meets the other's
    results: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def run(seed: int, loop) -> None:
        try:
            results[seed] = loop(seed, in_step=lambda: barrier.wait(timeout=30))
        except BaseException as error:  # a GuardError in a thread: reported by the test
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(s, loop)) for s, loop in enumerate(loops)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert [f.code for f in guard_all_codes.findings()] == []
    for seed, reference in enumerate(references):
        assert all(torch.equal(a, b) for a, b in zip(results[seed], reference, strict=True))
