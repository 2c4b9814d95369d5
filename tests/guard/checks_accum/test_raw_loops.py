"""ACL301, 303, 304, 305, 307, 312, 502, 505 in plain PyTorch loops: real short training loops on
CPU under the guard in raise mode, the error before the damage, and the must-not-flag loops."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accum_helpers import codes, grads_of, make_loader, make_model, mse, params_of, same  # noqa: E402

N = 4
HERE = "test_raw_loops.py:"


def accumulate(model, opt, loader, loss_scale=1 / N, gate=lambda i, n: (i + 1) % N == 0):
    """The textbook manual accumulation loop, parameterised by loss scaling and step gate."""
    for i, batch in enumerate(loader):
        (mse(model, batch) * loss_scale).backward()
        if gate(i, len(loader)):
            opt.step()
            opt.zero_grad()


# -- ACL301 ---------------------------------------------------------------------------------------


def test_acl301_undivided_window_warns_with_the_count(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    accumulate(model, opt, make_loader(), loss_scale=1.0)
    [finding] = guard_on.findings()
    assert finding.code == "ACL301" and finding.level == "warning"
    assert (
        "4 micro-batches contributed to this optimizer step through the same backward call, "
        "none divided by 4"
    ) in finding.message
    assert HERE in finding.location


@pytest.mark.parametrize(
    "variant",
    ["loss_divided", "loss_times_inverse", "grads_divided", "token_count", "no_accumulation"],
)
def test_acl301_must_not_flag(guard_on, variant):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = make_loader()
    for i, batch in enumerate(loader):
        loss = mse(model, batch)
        if variant == "loss_divided":
            loss = loss / N
        elif variant == "loss_times_inverse":
            loss = loss * (1 / N)
        elif variant == "token_count":
            loss = loss * len(batch[0]) / torch.tensor(float(len(batch[0]) * N))
        loss.backward()
        if variant == "no_accumulation" or (i + 1) % N == 0:
            if variant == "grads_divided":
                for p in model.parameters():
                    p.grad.div_(N)
            opt.step()
            opt.zero_grad()
    assert codes(guard_on) == []


def test_accumulation_with_a_gradient_penalty_and_an_fp32_island_is_clean(guard_on):
    """WGAN-GP style: autograd.grad(create_graph=True) builds a penalty term in the forward."""
    critic = make_model()
    opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for i, (x, _y) in enumerate(make_loader()):
        x = x.requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.float16):
            score = critic(x)
            with torch.autocast("cpu", enabled=False):
                (grad,) = torch.autograd.grad(score.float().sum(), x, create_graph=True)
                penalty = ((grad.norm(dim=1) - 1) ** 2).mean()
        loss = (score.float().mean() + 10 * penalty) / N
        scaler.scale(loss).backward()
        if (i + 1) % N == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    assert codes(guard_on) == []


# -- ACL303 ---------------------------------------------------------------------------------------


def test_acl303_clip_each_micro_step_raises_before_the_step(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    batches = iter(make_loader())
    mse(model, next(batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    before = params_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        mse(model, next(batches)).backward()
    assert info.value.code == "ACL303"
    assert "after 1 backward pass(es)" in str(info.value)
    assert same(before, params_of(model))  # no step happened on the partial sums


def test_acl303_fp16_unscale_each_micro_step_raises_before_torchs_error(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    batches = iter(make_loader())
    scaler.scale(mse(model, next(batches))).backward()
    scaler.unscale_(opt)
    with pytest.raises(guard_on.GuardError) as info:
        scaler.scale(mse(model, next(batches))).backward()
    assert info.value.code == "ACL303"
    guard_on.configure(mode="off")  # what the guard pre-empted: torch's own failure
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)


def test_acl303_fp16_second_unscale_after_a_zero_grad_raises_before_torchs_error(guard_on):
    """A zero_grad between two micro-steps' unscale_ calls hides the partial sum, but torch still
    refuses the second unscale_: the guard names the cause first (found by the generated-loop
    properties, tests/generated/)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    batches = iter(make_loader())
    scaler.scale(mse(model, next(batches))).backward()
    scaler.unscale_(opt)
    opt.zero_grad()
    scaler.scale(mse(model, next(batches))).backward()
    with pytest.raises(guard_on.GuardError) as info:
        scaler.unscale_(opt)
    assert info.value.code == "ACL303"
    assert "no optimizer step since the last unscale_" in str(info.value)


def test_acl303_clip_in_the_step_branch_is_fine(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, batch in enumerate(make_loader()):
        (mse(model, batch) / N).backward()
        if (i + 1) % N == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            opt.step()
            opt.zero_grad()
    assert codes(guard_on) == []


# -- ACL304 ---------------------------------------------------------------------------------------


def test_acl304_zero_grad_every_micro_batch_raises_before_the_first_step(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = params_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        for i, batch in enumerate(make_loader()):
            opt.zero_grad()
            (mse(model, batch) / N).backward()
            if (i + 1) % N == 0:
                opt.step()
    assert info.value.code == "ACL304"
    assert "discards the gradients of 1 micro-batch" in str(info.value)
    assert HERE in info.value.location
    assert same(before, params_of(model))


def test_acl304_must_not_flag_classic_loops_gans_and_window_start_zeroing(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mse(model, next(iter(make_loader()))).backward()  # a sanity-check backward, then a reset
    opt.zero_grad()
    for batch in make_loader():  # classic: zero_grad, backward, step
        opt.zero_grad()
        mse(model, batch).backward()
        opt.step()
    for i, batch in enumerate(make_loader()):  # zeroing at the start of each window
        if i % N == 0:
            opt.zero_grad()
        (mse(model, batch) / N).backward()
        if (i + 1) % N == 0:
            opt.step()
    gen, disc = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_g, opt_d = torch.optim.SGD(gen.parameters(), 0.01), torch.optim.SGD(disc.parameters(), 0.01)
    for _ in range(3):  # the generator's pass also reaches D; opt_g.step() consumed it
        fake = gen(torch.randn(4, 4))
        opt_d.zero_grad()
        disc(fake.detach()).mean().backward()
        opt_d.step()
        opt_g.zero_grad()
        (-disc(fake).mean()).backward()
        opt_g.step()
    model.eval()
    for x, _y in make_loader(batches=2):  # saliency maps after training: gradients on purpose
        x.requires_grad_(True)
        model.zero_grad()
        model(x).sum().backward()
        assert x.grad is not None
    model.train()
    assert codes(guard_on) == []


# -- ACL305 ---------------------------------------------------------------------------------------


def test_acl305_scheduler_every_micro_batch_raises_before_the_lr_moves(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    batch = next(iter(make_loader()))
    (mse(model, batch) / N).backward()
    with pytest.raises(guard_on.GuardError) as info:
        sched.step()
    assert info.value.code == "ACL305"
    assert opt.param_groups[0]["lr"] == 0.1


def test_acl305_must_not_flag_gated_epoch_plateau_and_two_schedulers(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
    decay = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    epoch_sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    for _epoch in range(2):
        for i, batch in enumerate(make_loader()):
            (mse(model, batch) / N).backward()
            if (i + 1) % N == 0:
                opt.step()
                opt.zero_grad()
                warmup.step()
                decay.step()
        epoch_sched.step()
        plateau.step(1.0)
    assert codes(guard_on) == []


def test_acl305_fp16_skip_test_is_respected(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    batch = next(iter(make_loader()))
    for poison in (True, False, False):
        loss = mse(model, batch) * (float("inf") if poison else 1.0)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if scaler.get_scale() >= before:  # skipped steps back the scale off
            sched.step()
    assert codes(guard_on) == []
    scaler.scale(mse(model, batch) * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()  # stepping after a skipped step is variant (b): a warning, training goes on
    [finding] = guard_on.findings()
    assert (finding.code, finding.level) == ("ACL305", "warning")
    assert "the only optimizer step since its last step was skipped by the GradScaler" in (
        finding.message
    )


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step:UserWarning")  # torch's
def test_acl305_epoch_scheduler_after_an_epoch_of_skipped_fp16_steps_is_silent(guard_on):
    """YOLOv5's first epoch: every step skipped while the loss scale calibrates, then the
    epoch-level scheduler steps. Its cadence is coarser than the optimizer's: not ACL305."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.9**epoch)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for _epoch in range(2):
        for batch in make_loader(batches=2 * N):
            scaler.scale(mse(model, batch) * float("inf")).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        sched.step()
    assert codes(guard_on) == []


# -- ACL307 ---------------------------------------------------------------------------------------


def test_acl307_tail_raises_before_the_next_epochs_first_step_takes_it(guard_on):
    """10 batches, N = 4: the 2-batch tail stays in .grad; the next epoch's first step would
    apply 6 micro-batches. It is refused before it changes any parameter."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make_loader(batches=10)
    accumulate(model, opt, loader)
    after_first_epoch = params_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        accumulate(model, opt, loader)
    assert info.value.code == "ACL307"
    assert "(10 batches) with 2 micro-batch(es) of an unfinished window (steps use 4)" in str(
        info.value
    )
    assert "leaks into this step's window" in str(info.value)
    assert HERE in info.value.location  # the loop over the loader
    assert same(params_of(model), after_first_epoch)


def test_acl307_the_last_epochs_tail_is_a_warning_at_exit(guard_on):
    from guard._tracker import TRACKER

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    accumulate(model, opt, make_loader(batches=10))
    assert codes(guard_on) == []  # the window may still go on: nothing to say yet
    TRACKER.emit("finish")
    [finding] = guard_on.findings()
    assert (finding.code, finding.level) == ("ACL307", "warning")
    assert "is lost: the run ended" in finding.message


def _next_batch(state: dict, loader):
    """nanoGPT's get_batch: a new pass starts as soon as the previous one is exhausted."""
    try:
        return next(state["it"])
    except (KeyError, StopIteration):
        state["it"] = iter(loader)
        return next(state["it"])


def test_acl307_must_not_flag_windows_that_span_passes_on_purpose(guard_on):
    """Step-based loops finish the window with the next pass: nanoGPT's `while` with a batch
    fetched ahead, and a global counter over a sized loader. Every step still takes N passes."""
    from guard._tracker import TRACKER

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader, state = make_loader(batches=10), {}
    batch = _next_batch(state, loader)
    for _ in range(6):  # 24 micro-batches over 10-batch passes: windows cross each pass end
        for _ in range(N):
            loss = mse(model, batch) / N
            batch = _next_batch(state, loader)  # prefetch before backward
            loss.backward()
        opt.step()
        opt.zero_grad()
    step = 0
    for _ in range(3):
        for batch in loader:
            (mse(model, batch) / N).backward()
            step += 1
            if step % N == 0:
                opt.step()
                opt.zero_grad()
    opt.step()  # 30 micro-batches made 7 windows of 4: the run steps the last 2 itself
    opt.zero_grad()
    TRACKER.emit("finish")
    assert codes(guard_on) == []


def test_acl307_a_tail_dropped_by_the_next_epochs_zero_grad_is_reported_once(guard_on):
    """timm/MAE style: zero_grad at the top of each epoch drops the last pass's tail. That is the
    dropped tail (ACL307, at the end of the pass), not a second finding of ACL304."""
    guard_on.configure(mode="warn")
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        accumulate(model, opt, make_loader(batches=10))
    assert codes(guard_on) == ["ACL307"]


class _Stream(IterableDataset):
    def __iter__(self):
        generator = torch.Generator().manual_seed(2)
        for _ in range(10):
            x = torch.randn(8, generator=generator)
            yield x, x.sum(dim=0, keepdim=True)


def test_acl307_must_not_flag_flushed_tails_full_batch_and_streams(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        accumulate(model, opt, make_loader(10), gate=lambda i, n: (i + 1) % N == 0 or i + 1 == n)
    for batch in make_loader(10):  # one step per epoch over the whole loader
        (mse(model, batch) / 10).backward()
    opt.step()
    opt.zero_grad()
    step = 0
    for _ in range(2):  # windows that span passes over a stream, on purpose
        for batch in DataLoader(_Stream(), batch_size=2):
            (mse(model, batch) / N).backward()
            step += 1
            if step % N == 0:
                opt.step()
                opt.zero_grad()
    assert codes(guard_on) == []


# -- ACL312 ---------------------------------------------------------------------------------------


def test_acl312_first_window_of_one_raises_before_the_second_step(guard_on):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    after_first = None
    with pytest.raises(guard_on.GuardError) as info:
        for i, batch in enumerate(make_loader()):
            (mse(model, batch) / N).backward()
            if i % N == 0:
                opt.step()
                opt.zero_grad()
                after_first = after_first or params_of(model)
    assert info.value.code == "ACL312"
    assert "first optimizer step used 1 micro-batch and this one uses 4" in str(info.value)
    assert same(after_first, params_of(model))


# -- ACL502 ---------------------------------------------------------------------------------------


def _dropout_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 1))


def test_acl502_training_left_in_eval_mode_raises_before_the_step(guard_on):
    model = _dropout_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = list(make_loader())
    mse(model, batches[0]).backward()
    opt.step()
    opt.zero_grad()
    model.eval()
    with torch.no_grad():
        mse(model, batches[1])
    mse(model, batches[2]).backward()  # training resumes, still in eval mode
    before = params_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        opt.step()
    assert info.value.code == "ACL502"
    assert same(before, params_of(model))


def test_acl502_eval_with_gradients_warns(guard_on):
    model = _dropout_model()
    model.eval()
    for batch in make_loader(batches=3):
        mse(model, batch).item()
    model.train()
    [finding] = guard_on.findings()
    assert finding.code == "ACL502" and finding.level == "warning"
    assert finding.message.startswith("3 forward(s) of Sequential in eval mode")


def test_acl502_must_not_flag_no_grad_eval_frozen_bn_and_adaptation(guard_on):
    model = _dropout_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = list(make_loader())
    for batch in batches[:2]:
        opt.zero_grad()
        mse(model, batch).backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        [mse(model, b) for b in batches]
    model.train()
    bn_model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    bn_opt = torch.optim.SGD(bn_model.parameters(), lr=0.01)
    bn_model[1].eval()  # BatchNorm frozen on purpose while the rest trains
    for batch in batches[:2]:
        bn_opt.zero_grad()
        mse(bn_model, batch).backward()
        bn_opt.step()
    adapted = _dropout_model().eval()  # test-time adaptation: adapt in eval mode from the start
    adapt_opt = torch.optim.SGD(adapted.parameters(), lr=0.01)
    for batch in batches[:2]:
        adapt_opt.zero_grad()
        adapted(batch[0]).var().backward()
        adapt_opt.step()
    assert codes(guard_on) == []


# -- ACL505 ---------------------------------------------------------------------------------------


def test_acl505_exhausted_filter_raises_before_the_clip(guard_on):
    model = make_model()
    params = filter(lambda p: p.requires_grad, model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    mse(model, next(iter(make_loader()))).backward()
    grads = grads_of(model)
    with pytest.raises(guard_on.GuardError) as info:
        torch.nn.utils.clip_grad_norm_(params, 1e-3)
    assert info.value.code == "ACL505"
    assert "received no parameters while the optimizers hold" in str(info.value)
    assert same(grads, grads_of(model))
    listed = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(listed, 1e-3)  # a list is fine
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # so is a fresh generator
    opt.step()
    assert codes(guard_on) == ["ACL505"]


# -- ACL308 ---------------------------------------------------------------------------------------


def _token_window_loop(steps: int, uneven_from: int) -> None:
    """A raw token-mean loop, N micro-batches per step; windows from `uneven_from` on mix short
    and long sequences."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        for micro in range(N):
            ids = torch.randint(1, 16, (2, 8))
            labels = ids.clone()
            if step >= uneven_from:
                labels[:, 1 + 7 * (micro % 2) :] = -100  # 1 or 8 valid tokens per row
            logits = model(ids).flatten(0, 1)
            (nn.functional.cross_entropy(logits, labels.flatten()) / N).backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("uneven_from, expected", [(0, ["ACL308"]), (9, ["ACL308"]), (40, [])])
def test_acl308_measures_a_sample_of_windows_and_still_finds_a_late_bias(
    guard_on, uneven_from, expected
):
    """Windows 0-7 and every 16th are measured: a bias from window 9 on shows at window 16;
    uniform windows (the whole run when it never turns uneven) stay silent."""
    guard_on.configure(mode="warn")
    _token_window_loop(steps=20, uneven_from=uneven_from)
    assert codes(guard_on) == expected
