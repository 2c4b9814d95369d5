"""What ACL301 counts as an accumulation window, and what hides the missing division.

Accumulation runs one backward line once per micro-batch; separate loss terms of one batch run
different lines. A constant weight is not a division by k. A norm clip hides the bug only when
the divided gradients would have been clipped to the same norm (checked here against the
gradients of the same loop)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import codes, make_loader, make_model, mse  # noqa: E402

N = 4


def test_separate_loss_terms_of_one_batch_are_not_a_window(guard_on):
    """A DCGAN discriminator step: real and fake terms backpropagated one after the other."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in make_loader():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        nn.functional.mse_loss(model(-x), -y).backward()
        opt.step()
    assert codes(guard_on) == []


def _two_heads(divide: bool) -> None:
    """A multi-task loss (retain_graph) in a loop that accumulates N micro-batches."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scale = 1 / N if divide else 1.0
    for i, (x, y) in enumerate(make_loader(batches=2 * N)):
        out = model(x)
        (nn.functional.mse_loss(out, y) * scale).backward(retain_graph=True)
        (out.abs().mean() * scale).backward()
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()


def test_two_loss_terms_per_micro_batch_divided_by_n_are_silent(guard_on):
    _two_heads(divide=True)
    assert codes(guard_on) == []


def test_two_loss_terms_per_micro_batch_undivided_report_n_not_2n(guard_on):
    _two_heads(divide=False)
    [finding] = guard_on.findings()
    assert finding.code == "ACL301"
    assert f"{N} micro-batches contributed" in finding.message
    assert f"none divided by {N}" in finding.message


@pytest.mark.parametrize("weight, expected", [(0.5, ["ACL301"]), (1 / N, []), (0.5 / N, [])])
def test_a_constant_weight_is_not_a_division_by_n(guard_on, weight, expected):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, batch in enumerate(make_loader(batches=2 * N)):
        (weight * mse(model, batch)).backward()  # noqa: ACL301 (a weight, on purpose)
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()
    assert codes(guard_on) == expected


def _undivided_window_norm() -> float:
    """The total gradient norm after N undivided passes (the clip's input in the loop below)."""
    model = make_model()
    for batch in list(make_loader(batches=N)):
        mse(model, batch).backward()
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()


@pytest.mark.parametrize("where", ["below", "above"])
def test_a_clip_hides_the_bug_only_when_the_divided_gradients_clip_alike(guard_on, where):
    norm = _undivided_window_norm()
    # "below": the divided norm (norm / N) is under the limit, so the divided loop would not clip
    # and the updates differ; "above": both are clipped to the same norm, the update is the same
    max_norm = norm / N * (2.0 if where == "below" else 0.5)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, batch in enumerate(make_loader(batches=N)):
        mse(model, batch).backward()  # noqa: ACL301 (undivided on purpose)
        if (i + 1) % N == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            opt.zero_grad()
    assert codes(guard_on) == (["ACL301"] if where == "below" else [])


def test_the_clip_argument_of_above_really_gives_the_divided_loop_the_same_update():
    """The premise of the "above" case, checked without the guard: clipped undivided and
    clipped divided gradients are equal when both norms exceed the limit."""
    norm = _undivided_window_norm()
    max_norm = norm / N * 0.5
    grads = []
    for scale in (1.0, 1 / N):
        model = make_model()
        for batch in list(make_loader(batches=N)):
            (mse(model, batch) * scale).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def _fairseq_update_freq(clip: float | None) -> None:
    """fairseq: sum-reduced losses over `update_freq` micro-batches, then the gradients are
    multiplied by 1 / (number of samples) through `.data` (which torch's version counter does not
    see), optionally followed by a clip."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = 0
    for i, (x, y) in enumerate(make_loader(batches=2 * N)):
        nn.functional.mse_loss(model(x), y, reduction="sum").backward()
        samples += len(x)
        if (i + 1) % N == 0:
            for p in model.parameters():
                p.grad.data.mul_(1.0 / samples)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
            samples = 0


@pytest.mark.parametrize("clip", [None, 1e9, 1e-3])
def test_gradients_divided_through_data_are_divided(guard_on, clip):
    _fairseq_update_freq(clip)
    assert codes(guard_on) == []


def test_a_loss_scaled_up_on_purpose_is_the_users_choice(guard_on):
    """YOLOv5 multiplies its mean loss by the batch size and sums the windows on purpose."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    for i, (x, y) in enumerate(make_loader(batches=2 * N)):
        (nn.functional.mse_loss(model(x), y) * len(x)).backward()  # noqa: ACL301 (scaled up on purpose)
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()
    assert codes(guard_on) == []
