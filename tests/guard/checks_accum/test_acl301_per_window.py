"""ACL301 reads the loss graph only until a window has a divided pass, and the gradient version
only after the passes that can still be reported: these loops pin that the savings keep the
signal (each window judged on its own, the version taken after the last backward)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import make_loader, make_model, mse  # noqa: E402

N = 4


def train(loader, divide=lambda window, pass_: False, between=lambda window, pass_, m: None):
    """Manual accumulation over N passes per step; `divide` picks the passes divided by N."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, batch in enumerate(loader):
        window, pass_ = divmod(i, N)
        loss = mse(model, batch)
        (loss / N if divide(window, pass_) else loss).backward()
        between(window, pass_, model)
        if pass_ == N - 1:
            opt.step()
            opt.zero_grad()


def test_a_divided_pass_silences_its_own_window_only(guard_on):
    # window 0 divides its first pass only (the graph is not read again in that window);
    # window 1 divides nothing and must still be reported
    train(make_loader(batches=2 * N), divide=lambda window, pass_: window == 0 and pass_ == 0)
    [finding] = guard_on.findings()
    assert finding.code == "ACL301"
    assert (
        f"{N} micro-batches contributed to this optimizer step through the same backward call, "
        "none divided"
    ) in finding.message


def test_every_window_divided_by_its_first_pass_alone_is_silent(guard_on):
    train(make_loader(batches=2 * N), divide=lambda window, pass_: pass_ == 0)
    assert guard_on.findings() == []


def test_gradients_rescaled_before_the_last_pass_are_still_reported(guard_on):
    # an in-place division in the middle of the window does not divide the passes after it:
    # the version compared at the step is the one after the last backward
    def halve_after_second_pass(window, pass_, model):
        if pass_ == 1:
            for p in model.parameters():
                p.grad.div_(2)

    train(make_loader(batches=N), between=halve_after_second_pass)
    assert [f.code for f in guard_on.findings()] == ["ACL301"]
