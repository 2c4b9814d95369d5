"""ACL108 unprepared-object-used: the original optimizer / scheduler stepped after `prepare`."""

from __future__ import annotations

import textwrap

CATALOGUE = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, p_opt, dl, p_sched = accelerator.prepare(model, opt, dl, sched)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step(); sched.step(); opt.zero_grad()    # original objects
"""


def test_catalogue_example_one_finding_per_original_object(acl108, at):
    assert acl108.findings(CATALOGUE) == [
        ("ACL108", *at(CATALOGUE, "opt.step()")),
        ("ACL108", *at(CATALOGUE, "sched.step()")),
    ]
    optimizer, scheduler = acl108.diagnostics(CATALOGUE)
    assert optimizer.fix.applicability == "safe"
    assert "(also `opt.zero_grad()` on line 9)" in optimizer.message
    assert "returned on line 5" in optimizer.message
    assert "schedule advances on every micro-batch" in scheduler.message
    assert acl108.fixed(CATALOGUE) == textwrap.dedent(CATALOGUE).replace(
        "opt.step(); sched.step(); opt.zero_grad()",
        "p_opt.step(); p_sched.step(); p_opt.zero_grad()",
    )


def test_trainer_class_self_optimizer_vs_self_opt(acl108, at):
    source = """
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, model, optimizer, loader):
            self.accelerator = Accelerator(gradient_accumulation_steps=2)
            self.optimizer = optimizer
            self.model, self.opt, self.loader = self.accelerator.prepare(
                model, self.optimizer, loader
            )
            self.base_lr = self.optimizer.param_groups[0]["lr"]

        def train_step(self, batch):
            with self.accelerator.accumulate(self.model):
                self.accelerator.backward(self.model(batch))
                self.optimizer.step()
                self.optimizer.zero_grad()
    """
    assert acl108.findings(source) == [("ACL108", *at(source, "self.optimizer.step()"))]
    fixed = acl108.fixed(source)
    assert "self.opt.step()\n" in fixed and "self.opt.zero_grad()\n" in fixed
    assert 'self.base_lr = self.optimizer.param_groups[0]["lr"]' in fixed


def test_guard_engine_helper_given_the_original(acl108, at):
    source = """
    import guard

    def train_one_epoch(engine, model, optimizer, loader):
        for x in loader:
            with engine.accumulate(model):
                engine.backward(model(x))
                optimizer.step()
                optimizer.zero_grad()

    def main():
        engine = guard.Engine(gradient_accumulation_steps=4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, p_opt, loader = engine.prepare(model, optimizer, loader)
        train_one_epoch(engine, model, optimizer, loader)
    """
    (diagnostic,) = acl108.diagnostics(source)
    assert (diagnostic.start.line, diagnostic.start.column) == at(source, "optimizer.step()")
    assert "(passed as `optimizer` on line 15)" in diagnostic.message
    assert "train_one_epoch(engine, model, p_opt, loader)" in acl108.fixed(source)


def test_function_reading_the_module_level_original_in_a_while_loop(acl108, at):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=8)
    model, prepared_optimizer = accelerator.prepare(model, optimizer)

    def update():
        optimizer.step()
        optimizer.zero_grad()

    step = 0
    while step < total:
        with accelerator.accumulate(model):
            accelerator.backward(model(next(batches)))
            update()
        step += 1
    """
    assert acl108.findings(source) == [("ACL108", *at(source, "optimizer.step()"))]
    fixed = acl108.fixed(source)
    assert "    prepared_optimizer.step()\n    prepared_optimizer.zero_grad()\n" in fixed


def test_zero_grad_alone_says_nothing_accumulates(acl108):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, p_opt, dl = accelerator.prepare(model, opt, dl)
    for x in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(x))
            p_opt.step()
            opt.zero_grad()
    """
    (diagnostic,) = acl108.diagnostics(source)
    assert "zeroes the gradients on every micro-batch" in diagnostic.message


def test_discarded_wrapper_is_reported_without_a_fix(acl108):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, _, dl = accelerator.prepare(model, optimizer, dl)
    for x in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(x))
            optimizer.step()
    """
    (diagnostic,) = acl108.diagnostics(source)
    assert diagnostic.fix is None
    assert acl108.fixed(source) == textwrap.dedent(source)


UNPREPARED = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
optimizer = torch.optim.AdamW(model.parameters())
lr_scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=10, num_training_steps=100)
model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
"""


def test_scheduler_never_prepared_stepped_in_accumulate(acl108, at):
    (diagnostic,) = acl108.diagnostics(UNPREPARED)
    assert (diagnostic.start.line, diagnostic.start.column) == at(UNPREPARED, "lr_scheduler.step")
    assert diagnostic.fix is None
    assert "never went through `accelerator.prepare`" in diagnostic.message
    assert "if accelerator.sync_gradients:" in diagnostic.message


def test_scheduler_never_prepared_reaches_a_helper(acl108, at):
    source = """
    from accelerate import Accelerator

    def train_step(accelerator, model, batch, optimizer, scheduler):
        with accelerator.accumulate(model):
            accelerator.backward(model(batch))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    def main():
        accelerator = Accelerator(gradient_accumulation_steps=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=100)
        model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
        for batch in dl:
            train_step(accelerator, model, batch, optimizer, scheduler)
    """
    assert acl108.findings(source) == [("ACL108", *at(source, "scheduler.step()"))]


# --- must not flag ----------------------------------------------------------------------------


def test_rebinding_to_the_same_name(acl108):
    source = CATALOGUE.replace("p_opt", "opt").replace("p_sched", "sched")
    assert acl108.findings(source) == []


def test_uses_before_prepare_and_read_only_uses_after(acl108):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    opt.zero_grad()
    model, p_opt, dl, p_sched = accelerator.prepare(model, opt, dl, sched)
    for x in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(x))
            p_opt.step()
            p_sched.step()
            p_opt.zero_grad()
        print(opt.param_groups[0]["lr"], len(opt.state_dict()["state"]))
    """
    assert acl108.findings(source) == []


def test_original_rebound_to_the_wrapper_after_prepare(acl108):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, p_opt = accelerator.prepare(model, opt)
    opt = p_opt
    opt.step()
    """
    assert acl108.findings(source) == []


def test_epoch_level_and_gated_schedulers(acl108):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    per_epoch = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    per_update = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=100)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
    for epoch in range(3):
        for x in dl:
            with accelerator.accumulate(model):
                accelerator.backward(model(x))
                optimizer.step()
                if accelerator.sync_gradients:
                    per_update.step()
                optimizer.zero_grad()
        per_epoch.step()
        plateau.step(val_loss)
    """
    assert acl108.findings(source) == []


def test_unprepared_scheduler_without_accumulation(acl108):
    source = UNPREPARED.replace("Accelerator(gradient_accumulation_steps=4)", "Accelerator()")
    assert acl108.findings(source) == []


def test_schedule_built_in_micro_batches(acl108):
    """Lengths multiplied by K: stepping once per micro-batch is the rate it was built for."""
    source = UNPREPARED.replace(
        "num_training_steps=100",
        "num_training_steps=args.max_train_steps * args.gradient_accumulation_steps",
    ).replace(
        "Accelerator(gradient_accumulation_steps=4)",
        "Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)",
    )
    assert acl108.findings(source) == []


def test_no_prepare_in_the_module(acl108):
    """A helper module: its objects may be prepared by the module that calls it."""
    source = """
    def train_step(accelerator, model, batch, optimizer):
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=10)
        with accelerator.accumulate(model):
            accelerator.backward(model(batch))
            optimizer.step()
            scheduler.step()
    """
    assert acl108.findings(source) == []


def test_scheduler_prepared_on_its_own(acl108):
    source = UNPREPARED.replace(
        "model, optimizer, dl = accelerator.prepare(model, optimizer, dl)",
        "model, optimizer, dl = accelerator.prepare(model, optimizer, dl)\n"
        "lr_scheduler = accelerator.prepare_scheduler(lr_scheduler)",
    )
    assert acl108.findings(source) == []
