"""ACL301 stays silent for a correct loop that averages gradients instead of losses: every
spelling of dividing the gradients before the step counts, in fp32 and in fp16 with a
GradScaler where the division comes before `scaler.unscale_` and the clip. The undivided loop
still reports, and each divided loop trains to the weights of a loop that divides the loss."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import codes, make_loader, make_model, mse, params_of, same  # noqa: E402

N = 4


def _divide(grads: list[torch.Tensor], how: str) -> None:
    if how == "inplace_op":
        for g in grads:
            g /= N
    elif how == "div_":
        for g in grads:
            g.div_(N)
    elif how == "foreach_div":
        torch._foreach_div_(grads, N)
    elif how == "foreach_mul":
        torch._foreach_mul_(grads, 1 / N)


def _loop(how: str, fp16: bool) -> list[torch.Tensor]:
    """The blog-post loop: scale(loss).backward() each micro-step; at the step divide the
    gradients by N, unscale, clip, step, update. `how="loss"` divides the loss instead."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=fp16)
    for i, batch in enumerate(make_loader(batches=2 * N)):
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            loss = mse(model, batch)
        scaler.scale(loss / N if how == "loss" else loss).backward()
        if (i + 1) % N == 0:
            _divide([p.grad for p in model.parameters()], how)
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    return params_of(model)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("how", ["inplace_op", "div_", "foreach_div", "foreach_mul"])
def test_gradients_divided_before_unscale_and_clip_are_silent(guard_on, how, fp16):
    trained = _loop(how, fp16)
    assert codes(guard_on) == []
    reference = _loop("loss", fp16)
    if fp16:  # fp16 rounding differs between dividing the loss and the gradients
        assert all(torch.allclose(a, b, atol=1e-3) for a, b in zip(trained, reference, strict=True))
    else:
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(trained, reference, strict=True))


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_undivided_gradients_still_report(guard_on, fp16):
    trained = _loop("none", fp16)
    assert codes(guard_on) == ["ACL301"]
    assert not same(trained, _loop("loss", fp16))
