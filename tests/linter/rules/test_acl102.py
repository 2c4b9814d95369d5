"""ACL102 scaler-step-bypass: `opt.step()` on gradients a GradScaler has scaled."""

from __future__ import annotations

import textwrap

RAW = """
import torch

scaler = torch.amp.GradScaler("cuda")
for x, y in dl:
    opt.zero_grad()
    scaler.scale(crit(model(x), y)).backward()
    opt.step()  # keep me
"""


def test_raw_loop_step_is_flagged_and_fixed_with_an_update(acl102, at):
    assert acl102.findings(RAW) == [("ACL102", *at(RAW, "opt.step()"))]
    assert acl102.fixed(RAW) == textwrap.dedent(RAW).replace(
        "    opt.step()  # keep me\n", "    scaler.step(opt)  # keep me\n    scaler.update()\n"
    )


def test_existing_update_is_kept_and_not_duplicated(acl102, at):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        opt.step()
        scaler.update()
        opt.zero_grad()
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "opt.step()"))]
    assert acl102.fixed(source) == textwrap.dedent(source).replace("opt.step()", "scaler.step(opt)")


def test_helper_function_with_scaler_parameter(acl102, at):
    source = """
    def train_one_epoch(model, loader, optimizer, scaler, accum):
        for i, (x, y) in enumerate(loader):
            scaler.scale(crit(model(x), y) / accum).backward()
            if (i + 1) % accum == 0 or i + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "optimizer.step()"))]
    expected = (
        "            scaler.step(optimizer)\n"
        "            scaler.update()\n"
        "            optimizer.zero_grad()\n"
    )
    assert expected in acl102.fixed(source)


def test_trainer_method_with_self_attributes(acl102, at):
    source = """
    import torch

    class Trainer:
        def __init__(self, model):
            self.model = model
            self.optimizer = torch.optim.AdamW(model.parameters())
            self.scaler = torch.amp.GradScaler("cuda")

        def fit(self, loader):
            for batch in loader:
                loss = self.model(**batch).loss
                self.scaler.scale(loss).backward()
                self.optimizer.step()
                self.optimizer.zero_grad()
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "self.optimizer.step()"))]
    expected = (
        "            self.scaler.step(self.optimizer)\n"
        "            self.scaler.update()\n"
        "            self.optimizer.zero_grad()\n"
    )
    assert expected in acl102.fixed(source)


def test_while_loop_with_counter_and_an_aliased_scaler(acl102, at):
    source = """
    from torch.cuda.amp import GradScaler as GS

    gs = GS()
    micro = 0
    while True:
        x, y = next(batches)
        gs.scale(crit(model(x), y) / K).backward()
        micro += 1
        if micro == K:
            opt.step(); opt.zero_grad()
            micro = 0
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "opt.step()"))]
    assert "        gs.step(opt); gs.update(); opt.zero_grad()\n" in acl102.fixed(source)


def test_scaled_loss_bound_to_a_name(acl102, at):
    source = """
    for x, y in dl:
        scaled = scaler.scale(crit(model(x), y))
        scaled.backward()
        opt.step()
        opt.zero_grad()
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "opt.step()"))]


def test_gan_two_bypasses_get_one_update_after_the_last_step(acl102, at):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for real in dl:
        scaler.scale(d_loss(disc, gen, real)).backward()
        opt_d.step()
        opt_d.zero_grad()
        scaler.scale(g_loss(disc, gen)).backward()
        opt_g.step()
        opt_g.zero_grad()
    """
    assert acl102.findings(source) == [
        ("ACL102", *at(source, "opt_d.step()")),
        ("ACL102", *at(source, "opt_g.step()")),
    ]
    fixed = acl102.fixed(source)
    assert fixed.count("scaler.update()") == 1
    assert "    scaler.step(opt_g)\n    scaler.update()\n    opt_g.zero_grad()\n" in fixed
    assert "    scaler.step(opt_d)\n    opt_d.zero_grad()\n" in fixed


def test_step_with_a_closure_is_reported_without_fix(acl102, at):
    source = """
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        opt.step(closure)
    """
    (diagnostic,) = acl102.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "opt.step")
    assert diagnostic.fix is None


def test_scaler_wrapper_that_steps_the_optimizer_directly(acl102, at):
    source = """
    import torch

    class LossScaler:
        def __init__(self):
            self._scaler = torch.amp.GradScaler("cuda")

        def __call__(self, loss, optimizer):
            self._scaler.scale(loss).backward()
            optimizer.step()
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "optimizer.step()"))]


# --- must not flag ---------------------------------------------------------------------------


def test_step_through_the_scaler_is_clean(acl102):
    source = """
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    """
    assert acl102.findings(source) == []


def test_step_through_a_same_module_helper_is_clean(acl102):
    source = """
    def amp_step(scaler, opt):
        scaler.step(opt)
        scaler.update()

    for x, y in dl:
        loss = crit(model(x), y)
        if fp16:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if fp16:
            amp_step(scaler, opt)
        else:
            opt.step()
    """
    assert acl102.findings(source) == []


def test_prepared_optimizer_is_clean(acl102):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        scaler.scale(model(**batch).loss).backward()
        opt.step()
    """
    assert acl102.findings(source) == []


def test_guard_engine_prepared_optimizer_is_clean(acl102):
    source = """
    import guard

    engine = guard.Engine(mixed_precision="fp16")
    model, optimizer = engine.prepare(model, optimizer)
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        optimizer.step()
    """
    assert acl102.findings(source) == []


def test_literal_disabled_scaler_is_clean(acl102):
    source = """
    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=False)
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        opt.step()
    """
    assert acl102.findings(source) == []


def test_second_fp32_model_after_the_scaled_one_is_clean(acl102):
    source = """
    for x, y in dl:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        probe_loss = crit(probe(x.detach()), y)
        probe_loss.backward()
        probe_opt.step()
    """
    assert acl102.findings(source) == []


def test_optimizer_of_a_model_the_scaled_loss_does_not_reach_is_clean(acl102):
    source = """
    import torch

    net, probe = Net(), Probe()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1)
    for x, y in dl:
        probe_loss = crit(probe(x), y)
        probe_loss.backward()
        loss = crit(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        probe_opt.step()
    """
    assert acl102.findings(source) == []


def test_fp32_branch_of_an_amp_switch_is_clean(acl102):
    source = """
    for x, y in dl:
        loss = crit(model(x), y)
        if use_amp:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
    """
    assert acl102.findings(source) == []


# --- composed with ACL103 ------------------------------------------------------------------


def test_with_acl103_exactly_one_update_is_inserted():
    """ACL103 (the discriminator's `scaler.step` is never updated) and ACL102 (the generator's
    direct step) both want an update: they insert it at the same place, so only one lands."""
    from linter.analysis import analyze_source
    from linter.fixer import fix_text

    source = textwrap.dedent("""
    for real in dl:
        scaler.scale(d_loss(disc, gen, real)).backward()
        scaler.step(opt_d)
        opt_d.zero_grad()
        scaler.scale(g_loss(disc, gen)).backward()
        opt_g.step()
        opt_g.zero_grad()
    """)
    analyse = lambda text: analyze_source(text, "snippet.py", ["ACL102", "ACL103"])  # noqa: E731
    assert {d.code for d in analyse(source)} == {"ACL102", "ACL103"}
    outcome = fix_text(source, analyse, unsafe=False)
    assert outcome.error is None and analyse(outcome.text) == []
    assert outcome.text == source.replace(
        "    opt_g.step()\n", "    scaler.step(opt_g)\n    scaler.update()\n"
    )
    assert fix_text(outcome.text, analyse, unsafe=False).text == outcome.text


def test_scaled_backward_in_a_method_the_loop_calls(acl102, at):
    source = """
    class Trainer:
        def training_step(self, batch):
            self.scaler.scale(self.model(**batch).loss).backward()

        def fit(self, loader):
            for batch in loader:
                self.training_step(batch)
                self.optimizer.step()
                self.optimizer.zero_grad()
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "self.optimizer.step()"))]
    expected = (
        "            self.scaler.step(self.optimizer)\n"
        "            self.scaler.update()\n"
        "            self.optimizer.zero_grad()\n"
    )
    assert expected in acl102.fixed(source)


def test_step_of_a_module_class_that_steps_through_its_scaler_is_clean(acl102):
    source = """
    import torch

    class AmpOptimizer:
        def __init__(self, optimizer):
            self.optimizer = optimizer
            self.scaler = torch.amp.GradScaler("cuda")

        def backward(self, loss):
            self.scaler.scale(loss).backward()

        def step(self):
            self.scaler.step(self.optimizer)
            self.scaler.update()

    amp_opt = AmpOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in dl:
        amp_opt.scaler.scale(crit(model(x), y)).backward()
        amp_opt.step()
    """
    assert acl102.findings(source) == []


def test_autograd_backward_of_a_scaled_loss(acl102, at):
    source = """
    import torch
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    grad_scaler = ShardedGradScaler()
    for x, y in dl:
        torch.autograd.backward(grad_scaler.scale(crit(model(x), y)))
        opt.step()
    """
    assert acl102.findings(source) == [("ACL102", *at(source, "opt.step()"))]
    assert "    grad_scaler.step(opt)\n    grad_scaler.update()\n" in acl102.fixed(source)


def test_scaler_disabled_through_a_module_alias_is_clean(acl102):
    source = """
    import torch.cuda.amp as amp

    gs = amp.GradScaler(enabled=False)
    for x, y in dl:
        gs.scale(crit(model(x), y)).backward()
        opt.step()
    """
    assert acl102.findings(source) == []


def test_caller_updating_the_scaler_leaves_no_fix(acl102, at):
    source = """
    def train_one_epoch(model, loader, opt, scaler):
        for x, y in loader:
            scaler.scale(crit(model(x), y)).backward()
            opt.step()

    def main():
        for epoch in range(epochs):
            train_one_epoch(model, loader, opt, scaler)
            scaler.update()
    """
    (diagnostic,) = acl102.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "opt.step()")
    assert diagnostic.fix is None
