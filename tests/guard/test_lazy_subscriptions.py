"""Checks that cannot fire yet cost nothing: subscriptions wait for a fact (`when=`), and the
DataLoader source counts batches without a subscriber per batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from guard._tracker import Tracker
from guard.sources import loaders


def test_a_waiting_subscription_runs_only_once_its_fact_holds():
    tracker, calls = Tracker(), []
    tracker.subscribe("backward", lambda **_: calls.append("scaled"), when="scaled")
    tracker.emit("backward")
    assert calls == []
    tracker.establish("scaled")
    tracker.emit("backward")
    assert calls == ["scaled"]


def test_woken_subscribers_keep_the_order_they_subscribed_in():
    tracker, calls = Tracker(), []
    tracker.subscribe("backward", lambda **_: calls.append(1), when="autocast")
    tracker.subscribe("backward", lambda **_: calls.append(2))
    tracker.subscribe("backward", lambda **_: calls.append(3), when="autocast")
    tracker.emit("backward")
    tracker.establish("autocast")
    tracker.emit("backward")
    assert calls == [2, 1, 2, 3]


def test_unsubscribing_works_for_waiting_and_live_subscriptions():
    tracker, calls = Tracker(), []
    drop_waiting = tracker.subscribe("optimizer_step", lambda **_: calls.append("w"), when="ddp")
    drop_live = tracker.subscribe("optimizer_step", lambda **_: calls.append("l"))
    drop_waiting()
    drop_live()
    tracker.establish("ddp")
    tracker.emit("optimizer_step")
    assert calls == []


def test_an_unknown_fact_is_refused():
    tracker = Tracker()
    with pytest.raises(ValueError, match="unknown fact 'scaler'"):
        tracker.subscribe("backward", lambda **_: None, when="scaler")
    with pytest.raises(ValueError, match="unknown fact 'scaler'"):
        tracker.establish("scaler")


def test_a_subscriber_woken_during_an_emit_starts_with_the_next_one():
    tracker, calls = Tracker(), []

    def first(**_) -> None:
        calls.append("first")
        tracker.establish("prepared")

    tracker.subscribe("backward", first)
    tracker.subscribe("backward", lambda **_: calls.append("woken"), when="prepared")
    tracker.emit("backward")
    tracker.emit("backward")
    assert calls == ["first", "first", "woken"]


def _train(loader, scaler=None, autocast=False) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x).float(), y) / 2
        (scaler.scale(loss) if scaler else loss).backward()
        if (i + 1) % 2 == 0:
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()


def _loader(batches: int = 4) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(batches * 8, 4, generator=gen), torch.arange(batches * 8) % 2)
    return DataLoader(data, batch_size=8)


@pytest.fixture
def fresh_guard(guard_on):
    """A new installation: facts established by earlier tests are gone."""
    guard_on.uninstall()
    guard_on.install()
    return guard_on


def _micro_step_subscribers(tracker) -> int:
    return sum(len(tracker._subs.get(event, ())) for event in ("backward_pre", "backward"))


def test_a_plain_fp32_loop_wakes_no_waiting_check(fresh_guard):
    from guard._tracker import TRACKER

    before = _micro_step_subscribers(TRACKER)
    _train(_loader())
    assert TRACKER.facts == set()
    assert _micro_step_subscribers(TRACKER) == before


@pytest.mark.parametrize(
    ("kwargs", "fact"),
    [({"scaler": "cpu"}, "scaled"), ({"autocast": True}, "autocast")],
)
def test_scaling_or_autocast_wakes_the_checks_that_need_them(fresh_guard, kwargs, fact):
    from guard._tracker import TRACKER

    before = _micro_step_subscribers(TRACKER)
    if "scaler" in kwargs:
        kwargs = {"scaler": torch.amp.GradScaler("cpu")}
    _train(_loader(), **kwargs)
    assert fact in TRACKER.facts
    assert _micro_step_subscribers(TRACKER) > before


def test_the_loader_source_counts_batches_and_passes(guard_on):
    loader = _loader(batches=3)
    starts, ends = [], []
    from guard._tracker import TRACKER

    drop_start = TRACKER.subscribe("loader_start", lambda iterator, **_: starts.append(iterator))
    drop_end = TRACKER.subscribe("loader_end", lambda iterator, **_: ends.append(iterator))
    try:
        fetched = loaders.LOADERS.fetched
        first = iter(loader)
        next(first)
        first_pass = loaders.LOADERS.latest_pass
        second = iter(loader)
        next(second)  # interleaved: another pass of the same loader
        assert loaders.LOADERS.latest() is second
        next(first)
        assert loaders.LOADERS.latest() is first
        assert loaders.LOADERS.latest_pass is first_pass
        assert not first_pass.finished
        assert len(list(first)) == 1  # the third batch, then the end of the pass
        assert first_pass.finished
        assert starts == [first, second]
        assert ends == [first]
        # 3 batches of `first`, 1 of `second`, and one for the exhausted pass
        assert loaders.LOADERS.fetched - fetched == 5
    finally:
        drop_start()
        drop_end()


def test_bf16_autocast_leaves_the_fp16_only_check_asleep(fresh_guard):
    from guard._tracker import TRACKER

    _train(_loader(), autocast=True)  # bfloat16
    assert "autocast" in TRACKER.facts
    assert "fp16-autocast" not in TRACKER.facts
    woken = [fn for fn in TRACKER._subs["backward_pre"] if "acl106" in fn.__module__]
    assert woken == []
