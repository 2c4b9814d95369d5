"""ACL305 ungated-scheduler-step: a scheduler stepped on micro-steps, or after a skipped step."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source
from linter.fixer import fix_text

RAW = """
for i, (x, y) in enumerate(dl):
    (crit(model(x), y) / N).backward()
    if (i + 1) % N == 0 or i + 1 == len(dl):
        opt.step()
        opt.zero_grad()
    sched.step()  # per micro-batch
"""


def test_raw_scheduler_every_micro_batch(acl305, at):
    assert acl305.findings(RAW) == [("ACL305", *at(RAW, "sched.step"))]
    assert acl305.fixed(RAW) == textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / N).backward()
            if (i + 1) % N == 0 or i + 1 == len(dl):
                opt.step()
                opt.zero_grad()
                sched.step()  # per micro-batch
        """
    )


def test_scheduler_before_the_backward_with_a_scaler(acl305, at):
    source = """
    scaler = torch.amp.GradScaler()
    for step, batch in enumerate(loader):
        lr_scheduler.step()
        scaler.scale(model(batch).loss / args.gradient_accumulation_steps).backward()
        if (step + 1) % args.gradient_accumulation_steps == 0 or step + 1 == len(loader):
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    """
    assert acl305.findings(source) == [("ACL305", *at(source, "lr_scheduler.step"))]
    fixed = acl305.fixed(source)
    assert "        optimizer.zero_grad()\n        lr_scheduler.step()\n" in fixed
    assert fixed.count("lr_scheduler.step()") == 1


def test_while_loop_with_a_window_counter(acl305, at):
    source = """
    micro = 0
    while True:
        (model(next(it)).loss / cfg["accum"]).backward()
        micro += 1
        if micro >= cfg["accum"]:
            optimizer.step()
            optimizer.zero_grad()
            micro = 0
        scheduler.step()
    """
    assert acl305.findings(source) == [("ACL305", *at(source, "scheduler.step"))]


def test_trainer_method(acl305, at):
    source = """
    class Trainer:
        def train_epoch(self):
            for i, batch in enumerate(self.loader):
                (self.model(batch).loss / self.accum).backward()
                if (i + 1) % self.accum == 0 or i + 1 == len(self.loader):
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                self.lr_scheduler.step()
    """
    assert acl305.findings(source) == [("ACL305", *at(source, "self.lr_scheduler.step"))]
    expected = "        self.optimizer.zero_grad()\n                self.lr_scheduler.step()\n"
    assert acl305.fixed(source).endswith(expected)


def test_nanogpt_scheduler_inside_the_micro_step_loop(acl305, at):
    source = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            loss = model(X, Y) / gradient_accumulation_steps
            loss.backward()
            scheduler.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl305.findings(source) == [("ACL305", *at(source, "scheduler.step"))]
    assert acl305.fixed(source).endswith(
        "        loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad(set_to_none=True)\n"
        "    scheduler.step()\n"
    )


def test_scheduler_after_a_scaler_step_is_a_hint_without_fix(acl305, at):
    source = """
    scaler = torch.amp.GradScaler()
    for x, y in dl:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = crit(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
        ema.update(model)
    """
    findings = acl305.diagnostics(source)
    assert [(d.code, d.start.line, d.start.column) for d in findings] == [
        ("ACL305", *at(source, "sched.step")),
        ("ACL305", *at(source, "ema.update")),
    ]
    assert all(d.message.startswith("hint: ") and d.fix is None for d in findings)


def test_prepared_scheduler_inside_accumulate(acl305):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            sched.step()
            opt.zero_grad()
    """
    assert acl305.findings(source) == []


def test_epoch_level_scheduler_outside_the_batch_loop(acl305):
    source = """
    for epoch in range(epochs):
        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / N).backward()
            if (i + 1) % N == 0 or i + 1 == len(dl):
                opt.step()
                opt.zero_grad()
        sched.step()
    """
    assert acl305.findings(source) == []


def test_nanogpt_scheduler_once_per_iteration(acl305):
    source = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            loss = model(X, Y) / gradient_accumulation_steps
            loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl305.findings(source) == []


def test_reduce_on_plateau_with_a_metric(acl305):
    source = """
    import torch

    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    for i, (x, y) in enumerate(dl):
        loss = crit(model(x), y) / N
        loss.backward()
        if (i + 1) % N == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
        plateau_sched.step(loss.item())
    """
    assert acl305.findings(source) == []


def test_loop_without_accumulation(acl305):
    source = """
    for x, y in dl:
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    """
    assert acl305.findings(source) == []


def test_schedulers_behind_a_skip_test(acl305):
    for test in ("not accelerator.optimizer_step_was_skipped", "scaler.get_scale() >= before"):
        source = f"""
        scaler = torch.amp.GradScaler()
        for x, y in dl:
            scaler.scale(crit(model(x), y)).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if {test}:
                sched.step()
        """
        assert acl305.findings(source) == [], test


def test_with_acl303_both_move_under_the_same_gate():
    source = textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / K).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if (i + 1) % K == 0 or i + 1 == len(dl):
                opt.step()
                opt.zero_grad()
            sched.step()
        """
    )
    codes = ["ACL303", "ACL305"]
    assert {d.code for d in analyze_source(source, "snippet.py", codes)} == set(codes)
    outcome = fix_text(source, lambda text: analyze_source(text, "snippet.py", codes), False)
    assert outcome.error is None
    assert outcome.diagnostics == []
    assert outcome.text == textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / K).backward()
            if (i + 1) % K == 0 or i + 1 == len(dl):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if (i + 1) % K == 0 or i + 1 == len(dl):
                opt.step()
                opt.zero_grad()
                sched.step()
        """
    )


def test_disabled_scaler_needs_no_skip_test(acl305):
    source = """
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
    """
    assert acl305.findings(source) == []


def test_ungated_scheduler_in_a_scaler_loop_is_variant_a(acl305, at):
    """Stepped per micro-batch in an fp16 loop: one finding, the one with the fix."""
    source = """
    scaler = torch.amp.GradScaler()
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y) / K).backward()
        if (i + 1) % K == 0 or i + 1 == len(dl):
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        sched.step()
    """
    (finding,) = acl305.diagnostics(source)
    assert (finding.start.line, finding.start.column) == at(source, "sched.step")
    assert finding.fix is not None and not finding.message.startswith("hint")


def test_prepared_scheduler_beside_accumulate_and_a_manual_gate(acl305):
    """The prepared scheduler steps only on the engine's sync steps wherever it is called."""
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=K)
    model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)
    for step, batch in enumerate(dl):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            if (step + 1) % K == 0:
                opt.step()
                opt.zero_grad()
        sched.step()
    """
    assert acl305.findings(source) == []


def test_with_acl304_both_calls_land_after_the_step():
    source = textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            opt.zero_grad()
            (crit(model(x), y) / K).backward()
            if (i + 1) % K == 0 or i + 1 == len(dl):
                opt.step()
            sched.step()
        """
    )
    codes = ["ACL304", "ACL305"]
    outcome = fix_text(source, lambda text: analyze_source(text, "snippet.py", codes), True)
    assert outcome.error is None and outcome.diagnostics == []
    assert outcome.text == textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / K).backward()
            if (i + 1) % K == 0 or i + 1 == len(dl):
                opt.step()
                opt.zero_grad()
                sched.step()
        """
    )


SIZED = """
import math

from transformers import get_scheduler


def train(args, model, optimizer, train_dataloader):
    LENGTH
    lr_scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=WARMUP,
        num_training_steps=TOTAL,
    )
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            last = step + 1 == len(train_dataloader)
            if (step + 1) % args.gradient_accumulation_steps == 0 or last:
                optimizer.step()
                optimizer.zero_grad()
            lr_scheduler.step()
"""


def sized(total: str, warmup: str = "args.num_warmup_steps", length: str = "pass") -> str:
    return SIZED.replace("LENGTH", length).replace("WARMUP", warmup).replace("TOTAL", total)


def test_schedule_sized_in_micro_steps_on_purpose(acl305):
    """A length in micro-batches stepped on every micro-batch is consistent (issue 22)."""
    K = "args.gradient_accumulation_steps"
    for total, warmup in (
        (f"args.max_steps * {K}", f"args.warmup_steps * {K}"),
        ("len(train_dataloader) * args.num_train_epochs", "args.num_warmup_steps"),
        ("args.max_steps", f"{K} * args.warmup_steps"),
    ):
        assert acl305.findings(sized(total, warmup)) == [], total


def test_schedule_sized_in_optimizer_steps_stepped_every_micro_step(acl305, at):
    length = (
        "num_update_steps_per_epoch = math.ceil(len(train_dataloader) / "
        "args.gradient_accumulation_steps)\n"
        "    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch"
    )
    source = sized("max_train_steps", length=length)
    assert acl305.findings(source) == [("ACL305", *at(source, "lr_scheduler.step()"))]
    (diagnostic,) = acl305.diagnostics(source)
    assert "(`num_training_steps=max_train_steps` at line 10 counts optimizer steps)" in (
        diagnostic.message
    )
    assert "                optimizer.zero_grad()\n                lr_scheduler.step()\n" in (
        acl305.fixed(source)
    )
    divided = sized("args.max_steps // args.gradient_accumulation_steps")
    assert acl305.findings(divided) == [("ACL305", *at(divided, "lr_scheduler.step()"))]
