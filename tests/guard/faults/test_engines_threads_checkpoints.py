"""The guard and the engine outside the single-loop, main-thread case: two engines in one
process, training in a thread, and a checkpoint saved mid-window and resumed. Each against a
hand-written reference loop, and the guard (every check selected) finds nothing."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import guard


def _data(seed: int, batches: int):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 5, generator=generator), torch.randn(4, 1, generator=generator))
            for _ in range(batches)]  # fmt: skip


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 1))


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _reference(seed: int, k: int, batches) -> torch.Tensor:
    """The correct accumulation loop, written out: each loss / k, a step every k batches."""
    model = _model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(batches):
        (F.mse_loss(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    return _params(model)


@pytest.fixture
def all_checks(guard_on):
    guard_on.configure(select=["ACL"])
    return guard_on


def _engine_micro_step(engine, model, optimizer, batch):
    x, y = batch
    with engine.accumulate(model):
        engine.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()


def test_two_engines_in_one_process_keep_their_own_windows(all_checks):
    first, second = _data(1, 12), _data(2, 12)
    engine_a = guard.Engine(gradient_accumulation_steps=2, device="cpu")
    engine_b = guard.Engine(gradient_accumulation_steps=3, device="cpu")
    model_a, model_b = _model(1), _model(2)
    model_a, opt_a = engine_a.prepare(model_a, torch.optim.SGD(model_a.parameters(), lr=0.1))
    model_b, opt_b = engine_b.prepare(model_b, torch.optim.SGD(model_b.parameters(), lr=0.1))
    for batch_a, batch_b in zip(first, second, strict=True):  # interleaved micro-steps
        _engine_micro_step(engine_a, model_a, opt_a, batch_a)
        _engine_micro_step(engine_b, model_b, opt_b, batch_b)
    assert torch.allclose(_params(model_a), _reference(1, 2, first), atol=1e-6, rtol=0)
    assert torch.allclose(_params(model_b), _reference(2, 3, second), atol=1e-6, rtol=0)
    assert (engine_a.optimizer_steps, engine_b.optimizer_steps) == (6, 4)
    assert all_checks.findings() == []


def _raw_loop(model, optimizer, batches, k: int) -> None:
    for i, (x, y) in enumerate(batches):
        (F.mse_loss(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()


def test_training_in_a_thread_is_watched_like_the_main_thread(all_checks):
    batches = _data(3, 8)
    model = _model(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    errors: list[BaseException] = []

    def train(loop_model, loop_optimizer, loop_batches):
        try:
            _raw_loop(loop_model, loop_optimizer, loop_batches, 4)
        except BaseException as exc:  # noqa: BLE001 (handed to the main thread)
            errors.append(exc)

    worker = threading.Thread(target=train, args=(model, optimizer, batches))
    worker.start()
    worker.join(timeout=120)
    assert errors == [] and all_checks.findings() == []
    assert torch.allclose(_params(model), _reference(3, 4, batches), atol=1e-6, rtol=0)

    broken = [(x.clone(), y) for x, y in batches]
    broken[5][0][0, 0] = float("nan")  # the second window's second batch
    model = _model(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    worker = threading.Thread(target=train, args=(model, optimizer, broken))
    worker.start()
    worker.join(timeout=120)
    (error,) = errors
    assert isinstance(error, guard.GuardError) and error.code == "ACL601"
    assert error.message.startswith("optimizer step 2: a loss passed to backward")
    assert torch.isfinite(_params(model)).all()  # raised before the step wrote the NaN


def test_checkpoint_saved_mid_window_and_resumed(all_checks, tmp_path):
    """Six of twelve batches (two into the second window of four), save_state, a fresh engine,
    model and optimizer load it and finish: the parameters of the uninterrupted run."""
    batches = _data(4, 12)

    def setup():
        engine = guard.Engine(gradient_accumulation_steps=4, device="cpu")
        model = _model(4)
        return engine, *engine.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    engine, model, optimizer = setup()
    for batch in batches[:6]:
        _engine_micro_step(engine, model, optimizer, batch)
    engine.save_state(str(tmp_path / "checkpoint"))
    engine, model, optimizer = setup()
    engine.load_state(str(tmp_path / "checkpoint"))
    for batch in batches[6:]:
        _engine_micro_step(engine, model, optimizer, batch)
    assert torch.allclose(_params(model), _reference(4, 4, batches), atol=1e-6, rtol=0)
    assert engine.optimizer_steps == 3
    assert all_checks.findings() == []
