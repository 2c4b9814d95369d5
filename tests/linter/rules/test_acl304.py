"""ACL304 zero-grad-in-window: zero_grad that wipes the micro-batches gathered so far."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source
from linter.fixer import fix_text

RAW = """
for i, (x, y) in enumerate(dl):
    opt.zero_grad()  # every batch
    loss = crit(model(x), y) / K
    loss.backward()
    if (i + 1) % K == 0 or i + 1 == len(dl):
        opt.step()
"""

ACCELERATE = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
for batch in dl:
    with accelerator.accumulate(model):
        opt.zero_grad()
        accelerator.backward(model(**batch).loss)
        opt.step()
        lr_scheduler.step()
"""


def test_raw_zero_grad_every_micro_step(acl304, at):
    assert acl304.findings(RAW) == [("ACL304", *at(RAW, "opt.zero_grad"))]
    assert acl304.fixed(RAW) == textwrap.dedent(RAW)  # unsafe only
    assert acl304.fixed(RAW, unsafe=True) == textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            loss = crit(model(x), y) / K
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(dl):
                opt.step()
                opt.zero_grad()  # every batch
        """
    )


def test_accelerate_zero_grad_at_the_top_of_the_block(acl304, at):
    assert acl304.findings(ACCELERATE) == [("ACL304", *at(ACCELERATE, "opt.zero_grad"))]
    assert acl304.fixed(ACCELERATE, unsafe=True) == textwrap.dedent(ACCELERATE).replace(
        "        opt.zero_grad()\n", ""
    ).replace("        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n")


def test_zero_grad_between_backward_and_gate_with_a_scaler(acl304, at):
    source = """
    scaler = torch.amp.GradScaler()
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y) / args.accum).backward()
        model.zero_grad()
        if (i + 1) % args.accum == 0 or i + 1 == len(dl):
            scaler.step(opt)
            scaler.update()
    """
    assert acl304.findings(source) == [("ACL304", *at(source, "model.zero_grad"))]
    fixed = acl304.fixed(source, unsafe=True)
    assert "        scaler.update()\n        model.zero_grad()\n" in fixed


def test_already_zeroed_after_the_step_only_the_extra_call_goes(acl304, at):
    source = RAW.replace("        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n")
    assert acl304.findings(source) == [("ACL304", *at(source, "opt.zero_grad"))]
    fixed = acl304.fixed(source, unsafe=True)
    assert fixed == textwrap.dedent(source).replace("    opt.zero_grad()  # every batch\n", "")


def test_while_loop_with_a_counter(acl304, at):
    source = """
    micro = 0
    while step < max_steps:
        optimizer.zero_grad()
        (model(next(it)).loss / cfg["accum"]).backward()
        micro += 1
        if micro == cfg["accum"]:
            optimizer.step()
            micro = 0
    """
    assert acl304.findings(source) == [("ACL304", *at(source, "optimizer.zero_grad"))]
    assert "        optimizer.step()\n        optimizer.zero_grad()\n" in acl304.fixed(
        source, unsafe=True
    )


def test_nanogpt_zero_grad_inside_the_micro_step_loop(acl304, at):
    source = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            optimizer.zero_grad(set_to_none=True)
            loss = model(X, Y) / gradient_accumulation_steps
            loss.backward()
        optimizer.step()
    """
    assert acl304.findings(source) == [("ACL304", *at(source, "optimizer.zero_grad"))]


def test_step_function_gated_by_its_caller_is_reported_without_fix(acl304, at):
    source = """
    class Trainer:
        def train_step(self, batch):
            self.optimizer.zero_grad()
            (self.model(batch).loss / self.accum).backward()

        def fit(self):
            for i, batch in enumerate(self.loader):
                self.train_step(batch)
                if (i + 1) % self.accum == 0 or i + 1 == len(self.loader):
                    self.optimizer.step()
    """
    assert acl304.findings(source) == [("ACL304", *at(source, "self.optimizer.zero_grad"))]
    assert acl304.fixed(source, unsafe=True) == textwrap.dedent(source)


def test_loop_without_accumulation(acl304):
    source = """
    for x, y in dl:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
    """
    assert acl304.findings(source) == []


def test_zero_grad_after_the_step_in_the_same_branch(acl304):
    source = RAW.replace("    opt.zero_grad()  # every batch\n", "").replace(
        "        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n"
    )
    assert acl304.findings(source) == []


def test_zero_grad_under_a_window_start_test(acl304):
    for test in ("i % K == 0", "micro == 0", "not accelerator.sync_gradients"):
        source = RAW.replace(
            "    opt.zero_grad()  # every batch\n", f"    if {test}:\n        opt.zero_grad()\n"
        )
        assert acl304.findings(source) == [], test


def test_zero_grad_after_the_step_inside_accumulate(acl304):
    source = ACCELERATE.replace("        opt.zero_grad()\n", "").replace(
        "        opt.step()\n", "        opt.step()\n        opt.zero_grad()\n"
    )
    assert acl304.findings(source) == []


def test_accelerator_without_accumulation(acl304):
    for config in ("", "gradient_accumulation_steps=1"):
        source = ACCELERATE.replace("gradient_accumulation_steps=4", config)
        assert acl304.findings(source) == [], config


def test_zero_grad_dropping_a_non_finite_window(acl304):
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / K).backward()
        if not grads_are_finite(model):
            opt.zero_grad()
            continue
        if (i + 1) % K == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
    """
    assert acl304.findings(source) == []


def test_nanogpt_zero_grad_once_per_iteration(acl304):
    source = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            loss = model(X, Y) / gradient_accumulation_steps
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl304.findings(source) == []


def test_with_acl301_the_fixes_compose():
    """An undivided loss and a zero_grad every batch: one pass fixes both."""
    source = textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            opt.zero_grad()
            loss = crit(model(x), y)
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(dl):
                opt.step()
        """
    )
    codes = ["ACL301", "ACL304"]
    assert {d.code for d in analyze_source(source, "snippet.py", codes)} == set(codes)
    outcome = fix_text(source, lambda text: analyze_source(text, "snippet.py", codes), True)
    assert outcome.error is None
    assert outcome.diagnostics == []
    assert outcome.text == textwrap.dedent(
        """
        for i, (x, y) in enumerate(dl):
            loss = crit(model(x), y)
            loss = loss / K
            loss.backward()
            if (i + 1) % K == 0 or i + 1 == len(dl):
                opt.step()
                opt.zero_grad()
        """
    )


# --- a GAN step in one accumulate() entry (holdout3: 1d-tokenizer's TiTok trainer) ----------
GAN = """
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
opt_g = torch.optim.AdamW(generator.parameters(), lr=2e-4, betas=(0.5, 0.9))
opt_d = torch.optim.AdamW(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.9))
generator, discriminator, opt_g, opt_d, loader = accelerator.prepare(
    generator, discriminator, opt_g, opt_d, loader
)
for images in loader:
    with accelerator.accumulate([generator, discriminator]):
        fake = generator(images)
        discriminator.requires_grad_(False)
        accelerator.backward(recon_loss(fake, images) - discriminator(fake).mean())
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)

        discriminator.requires_grad_(True)
        accelerator.backward(hinge_loss(discriminator, fake.detach(), images))
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)
"""


def test_zero_grad_after_its_own_step_before_the_discriminator_backward(acl304):
    assert acl304.findings(GAN) == []
    model_style = GAN.replace("opt_g.zero_grad(set_to_none=True)", "generator.zero_grad()")
    assert acl304.findings(model_style) == []


def test_discriminator_zeroed_before_its_backward_in_the_entry_is_flagged(acl304, at):
    """The discriminator's own zero_grad before its backward still wipes its window."""
    source = GAN.replace(
        "        discriminator.requires_grad_(True)\n",
        "        discriminator.requires_grad_(True)\n        opt_d.zero_grad()\n",
    )
    assert acl304.findings(source) == [("ACL304", *at(source, "opt_d.zero_grad()"))]
