"""ACL103 scaler-update-missing: `scaler.step` with no `scaler.update()` on every stepping path."""

from __future__ import annotations

import textwrap

RAW = """
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    scaler.scale(crit(model(x), y)).backward()
    scaler.step(opt)  # keep me
    opt.zero_grad()
"""


def test_raw_loop_without_update_is_flagged_and_fixed(acl103, at):
    assert acl103.findings(RAW) == [("ACL103", *at(RAW, "scaler.step(opt)"))]
    assert acl103.fixed(RAW) == textwrap.dedent(RAW).replace(
        "    scaler.step(opt)  # keep me\n",
        "    scaler.step(opt)  # keep me\n    scaler.update()\n",
    )


def test_update_in_a_logging_branch_is_moved_after_the_step(acl103, at):
    source = """
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        opt.zero_grad()
        if i % log_every == 0:
            log(i)
            scaler.update()
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "scaler.step(opt)"))]
    assert acl103.fixed(source) == textwrap.dedent("""
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if i % log_every == 0:
            log(i)
    """)


def test_update_once_per_epoch_is_moved_into_the_loop(acl103, at):
    source = """
    for epoch in range(epochs):
        for x, y in dl:
            scaler.scale(crit(model(x), y)).backward()
            scaler.step(opt)
            opt.zero_grad()
        scaler.update()
        evaluate(model)
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "scaler.step(opt)"))]
    fixed = acl103.fixed(source)
    assert "        scaler.step(opt)\n        scaler.update()\n        opt.zero_grad()\n" in fixed
    assert fixed.count("scaler.update()") == 1


def test_update_in_a_branch_that_cannot_be_emptied_leaves_no_fix(acl103, at):
    source = """
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        if i % log_every == 0:
            scaler.update()
    """
    (diagnostic,) = acl103.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "scaler.step(opt)")
    assert diagnostic.fix is None


def test_helper_function_with_accumulation_gate(acl103, at):
    source = """
    def train_one_epoch(model, loader, optimizer, scaler, accum):
        for i, (x, y) in enumerate(loader):
            scaler.scale(crit(model(x), y) / accum).backward()
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                scaler.step(optimizer)
                optimizer.zero_grad()
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "scaler.step(optimizer)"))]
    expected = "            scaler.step(optimizer)\n            scaler.update()\n"
    assert expected in acl103.fixed(source)


def test_trainer_method_with_self_scaler(acl103, at):
    source = """
    class Trainer:
        def fit(self, loader):
            for batch in loader:
                self.scaler.scale(self.model(**batch).loss).backward()
                self.scaler.step(self.optimizer)
                self.optimizer.zero_grad()
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "self.scaler.step"))]
    expected = "            self.scaler.step(self.optimizer)\n            self.scaler.update()\n"
    assert expected in acl103.fixed(source)


def test_while_loop_with_counter_and_one_line_step(acl103, at):
    source = """
    from torch.cuda.amp import GradScaler as GS

    gs = GS()
    micro = 0
    while micro < total:
        gs.scale(crit(model(next(it))) / K).backward()
        micro += 1
        if micro % K == 0:
            gs.step(opt); opt.zero_grad()
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "gs.step(opt)"))]
    assert "        gs.step(opt); gs.update(); opt.zero_grad()\n" in acl103.fixed(source)


def test_gan_without_update_gets_one_finding_and_one_update(acl103, at):
    source = """
    for real in dl:
        scaler.scale(d_loss(disc, gen, real)).backward()
        scaler.step(opt_d)
        opt_d.zero_grad()
        scaler.scale(g_loss(disc, gen)).backward()
        scaler.step(opt_g)
        opt_g.zero_grad()
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "scaler.step(opt_g)"))]
    fixed = acl103.fixed(source)
    assert fixed.count("scaler.update()") == 1
    assert "    scaler.step(opt_g)\n    scaler.update()\n" in fixed


def test_scaler_wrapper_that_never_updates(acl103, at):
    source = """
    import torch

    class LossScaler:
        def __init__(self):
            self._scaler = torch.amp.GradScaler("cuda")

        def __call__(self, loss, optimizer):
            self._scaler.scale(loss).backward()
            self._scaler.step(optimizer)
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "self._scaler.step"))]


# --- must not flag ---------------------------------------------------------------------------


def test_one_update_after_several_steps_is_clean(acl103):
    source = """
    for real in dl:
        scaler.scale(d_loss(disc, gen, real)).backward()
        scaler.step(opt_d)
        scaler.scale(g_loss(disc, gen)).backward()
        scaler.step(opt_g)
        scaler.update()
    """
    assert acl103.findings(source) == []


def test_update_in_an_unconditionally_called_helper_is_clean(acl103):
    source = """
    def finish_step():
        scaler.update()
        opt.zero_grad()

    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        finish_step()
    """
    assert acl103.findings(source) == []


def test_update_in_a_helper_called_only_when_logging_is_flagged(acl103, at):
    source = """
    def finish_step():
        scaler.update()

    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        if i % 10 == 0:
            finish_step()
    """
    assert acl103.findings(source) == [("ACL103", *at(source, "scaler.step(opt)"))]


def test_prepared_optimizer_is_clean(acl103):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
    for batch in dl:
        accelerator.backward(model(**batch).loss)
        scaler.step(optimizer)
    """
    assert acl103.findings(source) == []


def test_literal_disabled_scaler_is_clean(acl103):
    source = """
    import torch

    scaler = torch.cuda.amp.GradScaler(enabled=False)
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
    """
    assert acl103.findings(source) == []


def test_update_under_the_same_gate_as_the_step_is_clean(acl103):
    source = """
    for i, (x, y) in enumerate(dl):
        scaler.scale(crit(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    """
    assert acl103.findings(source) == []


def test_conditional_step_with_unconditional_update_is_clean(acl103):
    source = """
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        if not skip_step:
            scaler.step(opt)
        scaler.update()
    """
    assert acl103.findings(source) == []


def test_wrapper_updated_by_another_method_is_clean(acl103):
    source = """
    import torch

    class LossScaler:
        def __init__(self):
            self._scaler = torch.amp.GradScaler("cuda")

        def __call__(self, loss, optimizer):
            self._scaler.scale(loss).backward()
            self._scaler.step(optimizer)

        def update(self):
            self._scaler.update()
    """
    assert acl103.findings(source) == []


def test_timm_style_wrapper_is_clean(acl103):
    source = """
    import torch

    class NativeScaler:
        def __init__(self):
            self._scaler = torch.amp.GradScaler("cuda")

        def __call__(self, loss, optimizer, clip_grad=None, parameters=None):
            self._scaler.scale(loss).backward()
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()

    loss_scaler = NativeScaler()
    for x, y in dl:
        loss_scaler(crit(model(x), y), opt, clip_grad=1.0, parameters=model.parameters())
        opt.zero_grad()
    """
    assert acl103.findings(source) == []


def test_update_under_a_second_if_with_the_same_test_is_clean(acl103):
    source = """
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        if use_amp:
            scaler.step(opt)
        else:
            opt.step()
        if use_amp:
            scaler.update()
    """
    assert acl103.findings(source) == []


def test_caller_updating_once_per_epoch_leaves_no_fix(acl103, at):
    """An update inserted per step would be followed by the caller's own `scaler.update()` with
    no step in between, which torch rejects: reported, not fixed."""
    source = """
    def train_one_epoch(model, loader, opt, scaler):
        for x, y in loader:
            scaler.scale(crit(model(x), y)).backward()
            scaler.step(opt)
            opt.zero_grad()

    def main():
        for epoch in range(epochs):
            train_one_epoch(model, loader, opt, scaler)
            scaler.update()
    """
    (diagnostic,) = acl103.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "scaler.step(opt)")
    assert diagnostic.fix is None


# --- one update after the last optimizer, the steps spread over calls (holdout3: coqui Trainer) ---
PER_OPTIMIZER_METHOD = """
import torch


class Trainer:
    def __init__(self, model, optimizers, loader):
        self.model = model
        self.optimizers = optimizers
        self.loader = loader
        self.scaler = torch.amp.GradScaler("cuda")

    def optimize(self, batch, optimizer, optimizer_idx=None, num_optimizers=1):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = self.model(batch, optimizer_idx).mean()
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        if optimizer_idx is None or optimizer_idx + 1 == num_optimizers:
            self.scaler.update()
        optimizer.zero_grad()

    def train_epoch(self):
        for batch in self.loader:
            if len(self.optimizers) == 1:
                self.optimize(batch, self.optimizers[0])
            else:
                for idx, optimizer in enumerate(self.optimizers):
                    self.optimize(batch, optimizer, idx, len(self.optimizers))
"""


def test_update_after_the_last_of_the_optimizers_a_caller_loops_over_is_clean(acl103):
    assert acl103.findings(PER_OPTIMIZER_METHOD) == []


def test_gan_step_function_updating_on_the_last_optimizer_is_clean(acl103):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda")


    def gan_step(real, opt, which, is_last):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = losses[which](generator, discriminator, real)
        scaler.scale(loss).backward()
        scaler.step(opt)
        if is_last:
            scaler.update()
        opt.zero_grad(set_to_none=True)


    for real in loader:
        optimizers = [d_opt, g_opt]
        for i, opt in enumerate(optimizers):
            gan_step(real, opt, i, is_last=i == len(optimizers) - 1)
    """
    assert acl103.findings(source) == []


def test_update_under_a_logging_flag_of_a_per_optimizer_function_is_flagged(acl103, at):
    """The flag the caller passes is not the optimizer loop's: the update is a logging branch."""
    source = (
        PER_OPTIMIZER_METHOD.replace(
            "optimizer_idx is None or optimizer_idx + 1 == num_optimizers", "log_scale"
        )
        .replace("num_optimizers=1):", "num_optimizers=1, log_scale=False):")
        .replace(
            "self.optimize(batch, optimizer, idx, len(self.optimizers))",
            "self.optimize(batch, optimizer, idx, len(self.optimizers), log_scale=step_log)",
        )
    )
    assert acl103.findings(source) == [("ACL103", *at(source, "self.scaler.step(optimizer)"))]
