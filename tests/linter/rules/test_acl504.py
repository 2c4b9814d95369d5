"""ACL504 logged-scaled-loss: per-micro-step logs of a loss divided by K or scaled."""

from __future__ import annotations

import pytest

MANUAL = """
for i, (x, y) in enumerate(dl):
    loss = crit(model(x), y) / N
    loss.backward()
    LOG
    if (i + 1) % N == 0 or i + 1 == len(dl):
        opt.step()
        opt.zero_grad()
"""


def manual(log: str) -> str:
    return MANUAL.replace("LOG", log)


def test_divided_loss_logged_every_micro_step(acl504, at):
    source = manual('writer.add_scalar("train/loss", loss.item(), step)')
    assert acl504.findings(source) == [("ACL504", *at(source, "writer.add_scalar"))]
    message = acl504.diagnostics(source)[0].message
    assert "line 3 divided it by K = `N`" in message and "K times smaller" in message


def test_item_outside_a_logger_call(acl504, at):
    source = manual("lossf = loss.item()")
    assert acl504.findings(source) == [("ACL504", *at(source, "loss.item()"))]


def test_in_place_division_and_an_f_string(acl504, at):
    source = """
    micro = 0
    while True:
        x, y = next(batches)
        loss = crit(model(x), y)
        loss /= args.grad_accum
        loss.backward()
        logger.info(f"loss {loss.item():.4f}")
        micro += 1
        if micro == args.grad_accum:
            opt.step()
            opt.zero_grad()
            micro = 0
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "logger.info"))]


def test_scaled_loss_logged(acl504, at):
    source = """
    import torch
    import wandb

    scaler = torch.amp.GradScaler("cuda")
    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(model(x), y)
        scaled = scaler.scale(loss)
        scaled.backward()
        wandb.log({"loss": scaled.item()})
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "wandb.log"))]
    assert "loss scale" in acl504.diagnostics(source)[0].message


def test_progress_bar_in_a_helper_function(acl504, at):
    source = """
    def train_one_epoch(model, loader, opt, accum, pbar):
        for i, (x, y) in enumerate(loader):
            loss = crit(model(x), y) / accum
            loss.backward()
            pbar.set_postfix(loss=loss.item())
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "pbar.set_postfix"))]


def test_micro_step_loop_of_nanogpt_style(acl504, at):
    source = """
    while iter_num < max_iters:
        for micro_step in range(gradient_accumulation_steps):
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            loss.backward()
            print(loss.item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "print(loss"))]


def test_hint_for_item_of_the_undivided_loss_every_micro_step(acl504, at):
    source = """
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y)
        (loss / N).backward()
        print(loss.item())
        if (i + 1) % N == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "print(loss"))]
    assert acl504.diagnostics(source)[0].message.startswith("hint: `loss.item()` runs on every")


def test_multiplied_back_by_k(acl504):
    assert acl504.findings(manual('writer.add_scalar("loss", loss.item() * N, step)')) == []
    assert acl504.findings(manual("print((loss * N).item())")) == []


def test_window_sum_of_the_divided_parts(acl504):
    """The sum of the `loss / N` of a window is the window's mean loss."""
    source = manual("window += loss.item()")
    assert acl504.findings(source) == []
    assert acl504.findings(manual("window = window + loss.detach()")) == []


def test_window_mean_logged_on_the_update_step(acl504):
    source = """
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y)
        window_sum += loss.detach()
        (loss / N).backward()
        if (i + 1) % N == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
            writer.add_scalar("train/loss", (window_sum / N).item(), step)
            window_sum = torch.zeros_like(window_sum)
    """
    assert acl504.findings(source) == []


def test_undivided_loss_under_the_engine_backward(acl504):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            print(loss.item())
            accelerator.log({"loss": accelerator.gather(loss).mean().item()})
            opt.step()
            opt.zero_grad()
    """
    assert acl504.findings(source) == []


def test_a_divided_loss_is_wrong_at_any_cadence(acl504, at):
    """Logging every 50 steps does not make a K-th of the loss the loss."""
    source = manual('if i % args.logging_steps == 0:\n        print("loss", loss.item())')
    assert acl504.findings(source) == [("ACL504", *at(source, "print("))]


def test_divided_loss_logged_in_the_step_branch(acl504, at):
    source = """
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter()
    for step, batch in enumerate(train_loader):
        loss = model(**batch).loss
        loss = loss / args.accum_steps
        loss.backward()
        if (step + 1) % args.accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
            writer.add_scalar("loss/train", loss.item(), step)
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "writer.add_scalar"))]
    assert "K = `args.accum_steps`" in acl504.diagnostics(source)[0].message


def test_scaled_loss_logged_under_a_log_interval(acl504, at):
    source = """
    import torch
    import wandb

    scaler = torch.amp.GradScaler("cuda")
    for step, (x, y) in enumerate(dl):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(model(x), y)
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if step % 50 == 0:
            wandb.log({"loss/train": scaled.item()})
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "wandb.log"))]
    assert "loss scale" in acl504.diagnostics(source)[0].message


NANOGPT_STYLE = """
while True:
    for micro_step in range(grad_accum):
        with ctx:
            _, loss = model(X, Y)
            loss = loss / grad_accum
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % log_interval == 0 and master_process:
        lossf = LOSSF
        print(f"iter {iter_num}: loss {lossf:.4f}")
    iter_num += 1
"""


def test_divided_loss_read_after_the_micro_step_loop_at_a_log_interval(acl504, at):
    source = NANOGPT_STYLE.replace("LOSSF", "loss.item()")
    assert acl504.findings(source) == [("ACL504", *at(source, "loss.item()"))]


def test_divided_loss_multiplied_back_after_the_micro_step_loop(acl504):
    assert acl504.findings(NANOGPT_STYLE.replace("LOSSF", "loss.item() * grad_accum")) == []


MICRO_LOOP_HINT = """
import wandb

while iter_num < max_iters:
    running = 0.0
    for micro_step in range(accum):
        _, loss = model(X, Y)
        X, Y = get_batch("train")
        (loss / accum).backward()
        LOG
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
"""


def test_hint_for_item_inside_a_micro_step_loop(acl504, at):
    for log, needle in (
        ("running += loss.item()", "loss.item()"),
        ("print(loss.item())", "print("),
        ('wandb.log({"loss": loss.item()})', "wandb.log"),
        ('if wandb_log:\n            wandb.log({"loss": loss.item()})', "wandb.log"),
    ):
        source = MICRO_LOOP_HINT.replace("LOG", log)
        assert acl504.findings(source) == [("ACL504", *at(source, needle))], log
        assert acl504.diagnostics(source)[0].severity == "info"


def test_no_hint_once_per_window_after_a_micro_step_loop(acl504):
    source = MICRO_LOOP_HINT.replace("LOG", "pass").replace(
        "    optimizer.step()", "    print(loss.item())\n    optimizer.step()"
    )
    assert acl504.findings(source) == []


def test_hint_under_a_switch_that_is_not_a_cadence(acl504, at):
    """`if log_writer is not None:` turns logging on; it still runs on every micro-step."""
    source = """
    for it, (x, y) in enumerate(loader):
        loss = crit(model(x), y)
        (loss / accum_iter).backward()
        if log_writer is not None:
            log_writer.add_scalar("train_loss", loss.item(), it)
        if (it + 1) % accum_iter == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "log_writer.add_scalar"))]


def test_no_hint_under_a_log_interval(acl504):
    source = """
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y)
        (loss / N).backward()
        if i % args.logging_steps == 0:
            print("loss", loss.item())
        if global_step > 0 and is_log_step:
            print("loss", loss.item())
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()
            writer.add_scalar("train/loss", loss.item(), i)
    """
    assert acl504.findings(source) == []


def test_logging_on_the_update_step(acl504):
    source = """
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y) / N
        loss.backward()
        if (i + 1) % N == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
            print(loss.item() * N)
    """
    assert acl504.findings(source) == []


def test_no_accumulation_no_hint(acl504):
    source = """
    for x, y in dl:
        loss = crit(model(x), y)
        loss.backward()
        print(loss.item())
        opt.step()
        opt.zero_grad()
    """
    assert acl504.findings(source) == []


def test_rebound_loss_is_not_the_divided_one(acl504):
    source = manual("loss = crit(model(x), y)\n    print(loss.item())")
    assert acl504.findings(source) == []


def test_divided_loss_handed_to_a_backward_helper(acl504, at):
    """The backward runs inside an imported scaler helper; the loop still divides the loss by
    its accumulation value and logs that."""
    source = """
    for idx, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss = loss / config.TRAIN.ACCUMULATION_STEPS
        loss_scaler(loss, optimizer, update_grad=(idx + 1) % config.TRAIN.ACCUMULATION_STEPS == 0)
        meter.update(loss.item(), y.size(0))
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "loss.item()"))]


def test_rebinding_in_the_other_branch_leaves_this_one_divided(acl504, at):
    source = """
    for i, (x, y) in enumerate(dl):
        if accum_steps > 1:
            loss = crit(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                opt.step()
                opt.zero_grad()
        else:
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        meter.update(loss.item())
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "loss.item()"))]


def test_other_values_divided_by_k_are_not_losses(acl504):
    source = """
    for idx, (x, y) in enumerate(loader):
        lr = base_lr / config.TRAIN.ACCUMULATION_STEPS
        print(lr)
        loss_scaler(criterion(model(x), y), optimizer)
    """
    assert acl504.findings(source) == []


def test_hint_for_an_item_read_before_the_backward_of_the_same_micro_step(acl504, at):
    """`running += loss.item()` between the forward and `(loss / K).backward()` syncs on every
    micro-step as much as a read after the backward does."""
    source = """
    for it in range(max_iters):
        running = 0.0
        for micro_step in range(grad_accum):
            logits, loss = model(*get_batch("train"))
            running += loss.item()
            (loss / grad_accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """
    (finding,) = acl504.diagnostics(source)
    assert (finding.start.line, finding.start.column) == at(source, "loss.item()")
    assert finding.severity == "info"


@pytest.mark.parametrize(
    "back", ["batch_loss = batch_loss * accum", "batch_loss *= accum"], ids=["assign", "augmented"]
)
def test_a_value_taken_from_the_divided_loss_and_multiplied_back_is_the_loss(acl504, at, back):
    """nanoVLM: `batch_loss = loss.item()`, then `batch_loss *= K` before it is summed: the
    kept value is the loss again. Without the multiplication the read is still reported."""
    source = f"""
    for i, x in enumerate(dataloader):
        loss = model(x).mean()
        if accum > 1:
            loss = loss / accum
        loss.backward()
        if (i + 1) % accum == 0 or i + 1 == len(dataloader):
            optimizer.step()
            optimizer.zero_grad()
        batch_loss = loss.item()
        if accum > 1:
            {back}
        total_train_loss += batch_loss
    """
    assert acl504.findings(source) == []
    kept = source.replace(f"            {back}\n", "            pass\n")
    assert [c for c, *_ in acl504.findings(kept)] == ["ACL504"]


def test_a_comprehension_binding_the_same_name_reads_its_own_values(acl504):
    # Adam-mini's llama example: `[loss.item() for loss in losses_since_last_log]` logs the
    # undivided values the list holds; its `loss` is the comprehension's, not the divided one.
    source = manual("history.append(raw)\n    values = [loss.item() for loss in history]")
    assert acl504.findings(source) == []
    source = manual("print(sum(loss.item() for i, loss in enumerate(history)))")
    assert acl504.findings(source) == []


def test_the_divided_loss_read_inside_a_comprehension_is_still_logged(acl504, at):
    source = manual("print([loss.item() for h in history])")
    assert acl504.findings(source) == [("ACL504", *at(source, "print("))]
    source = manual("print([loss for loss in [loss.item()]])")  # its first iterable: outside
    assert acl504.findings(source) == [("ACL504", *at(source, "print("))]


def test_the_message_names_the_divisor_when_no_gate_or_engine_k_is_in_sight(acl504, at):
    """A DeepSpeed engine steps itself (`model.step()` is no optimizer the linter gates on):
    the K the message names is the loss's own divisor, not a bare `K`."""
    source = """
    import deepspeed
    import torch

    def main(args, net, dl):
        model, optimizer, _, _ = deepspeed.initialize(args=args, model=net)
        args.gradient_accumulation_steps = model.gradient_accumulation_steps()
        ema = 0.0
        for step, (x, y) in enumerate(dl):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss = loss / args.gradient_accumulation_steps
            ema = 0.9 * ema + 0.1 * loss.item()
            model.backward(loss)
            model.step()
    """
    assert acl504.findings(source) == [("ACL504", *at(source, "loss.item()"))]
    message = acl504.diagnostics(source)[0].message
    assert "divided it by K = `args.gradient_accumulation_steps` for the backward" in message
