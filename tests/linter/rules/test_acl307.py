"""ACL307 dropped-tail-window: a modulo step gate over a sized loader with no last-batch clause."""

from __future__ import annotations

import textwrap

from linter.analysis import analyze_source
from linter.fixer import fix_text

RAW = """
for epoch in range(epochs):
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / N).backward()
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()
"""


def test_raw_gate_without_last_batch_clause(acl307, at):
    assert acl307.findings(RAW) == [("ACL307", *at(RAW, "(i + 1) % N"))]
    assert acl307.fixed(RAW) == RAW  # unsafe: not applied by default
    assert acl307.fixed(RAW, unsafe=True) == textwrap.dedent(RAW).replace(
        "(i + 1) % N == 0:", "(i + 1) % N == 0 or i + 1 == len(dl):"
    )


def test_last_remainder_spelling(acl307, at):
    source = """
    for i, batch in enumerate(loader):
        (model(batch).loss / args.gradient_accumulation_steps).backward()
        if i % args.gradient_accumulation_steps == args.gradient_accumulation_steps - 1:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "i % args"))]
    assert "== args.gradient_accumulation_steps - 1 or i + 1 == len(loader):" in acl307.fixed(
        source, unsafe=True
    )


def test_gate_bound_to_a_name_is_extended_where_it_is_bound(acl307, at):
    source = """
    for step, batch in enumerate(train_loader):
        is_update = (step + 1) % cfg["grad_accum"] == 0
        (model(batch).loss / cfg["grad_accum"]).backward()
        if is_update:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(step + 1) %"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert (
        'is_update = (step + 1) % cfg["grad_accum"] == 0 or step + 1 == len(train_loader)' in fixed
    )


def test_helper_function_and_progress_bar(acl307, at):
    source = """
    from tqdm import tqdm

    def train_one_epoch(model, loader, optimizer, accum):
        for i, (x, y) in enumerate(tqdm(loader)):
            (crit(model(x), y) / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) % accum"))]
    assert "(i + 1) % accum == 0 or i + 1 == len(loader):" in acl307.fixed(source, unsafe=True)


def test_trainer_method_with_self_attributes(acl307, at):
    source = """
    class Trainer:
        def train_epoch(self):
            for i, batch in enumerate(self.train_loader):
                (self.model(batch).loss / self.accum).backward()
                if (i + 1) % self.accum == 0:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) % self"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert "(i + 1) % self.accum == 0 or i + 1 == len(self.train_loader):" in fixed


def test_early_exit_gate_gets_an_and_clause(acl307, at):
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / 4).backward()
        if (i + 1) % 4 != 0:
            continue
        opt.step()
        opt.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(i + 1) % 4"))]
    assert "if (i + 1) % 4 != 0 and i + 1 != len(dl):" in acl307.fixed(source, unsafe=True)


def test_one_based_enumerate_and_a_compound_gate(acl307, at):
    source = """
    for i, (x, y) in enumerate(dl, start=1):
        (crit(model(x), y) / K).backward()
        if i % K == 0 and not args.dry_run:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "i % K"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert "if (i % K == 0 and not args.dry_run) or i == len(dl):" in fixed


def test_gates_with_a_last_batch_clause(acl307):
    for clause in (
        "or i + 1 == len(dl)",
        "or i == len(dl) - 1",
        "or is_last",
        "or accelerator.sync_gradients",
    ):
        assert acl307.findings(RAW.replace("== 0:", f"== 0 {clause}:")) == []


def test_last_batch_clause_through_a_named_flag(acl307):
    source = """
    for i, (x, y) in enumerate(dl):
        last = i + 1 == len(dl)
        (crit(model(x), y) / K).backward()
        if last or (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_global_step_over_an_endless_loader(acl307):
    """Step-based training: windows span epochs on purpose."""
    source = """
    import itertools

    global_step = 0
    for batch in itertools.cycle(dl):
        (model(batch).loss / K).backward()
        global_step += 1
        if global_step % K == 0:
            opt.step()
            opt.zero_grad()
        if global_step >= max_steps:
            break
    """
    assert acl307.findings(source) == []


def test_counter_in_a_while_loop(acl307):
    source = """
    step = 0
    while step < max_steps:
        (model(next(it)).loss / K).backward()
        step += 1
        if step % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_enumerate_over_an_iterator(acl307):
    source = """
    batches = iter(dl)
    for i, batch in enumerate(batches):
        (model(batch).loss / K).backward()
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_accumulate_over_a_prepared_loader(acl307):
    source = """
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_nanogpt_micro_step_loop(acl307):
    source = """
    while True:
        for micro_step in range(gradient_accumulation_steps):
            loss = model(X, Y) / gradient_accumulation_steps
            X, Y = get_batch("train")
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl307.findings(source) == []


def test_tail_stepped_after_the_loop(acl307):
    source = """
    for epoch in range(epochs):
        for i, (x, y) in enumerate(dl):
            (crit(model(x), y) / N).backward()
            if (i + 1) % N == 0:
                opt.step()
                opt.zero_grad()
        if len(dl) % N:
            opt.step()
            opt.zero_grad()
    """
    assert acl307.findings(source) == []


def test_with_acl312_on_one_gate_the_fixes_compose():
    """Both fixes on `step % K == 0` give `(step + 1) % K == 0 or step + 1 == len(dl)`."""
    source = textwrap.dedent(
        """
        for step, batch in enumerate(dl):
            (model(batch).loss / K).backward()
            if step % K == 0:
                opt.step()
                opt.zero_grad()
        """
    )
    codes = ["ACL307", "ACL312"]
    assert {d.code for d in analyze_source(source, "snippet.py", codes)} == set(codes)
    outcome = fix_text(source, lambda text: analyze_source(text, "snippet.py", codes), True)
    assert outcome.error is None
    assert outcome.diagnostics == []
    assert outcome.text == source.replace(
        "if step % K == 0:", "if (step + 1) % K == 0 or step + 1 == len(dl):"
    )


def test_gate_before_the_backward_is_reported_without_fix(acl307, at):
    """A last-batch clause at the top of the loop would step before the last backward."""
    source = """
    for i, (x, y) in enumerate(dl):
        if i % K == 0:
            opt.step()
            opt.zero_grad()
        (crit(model(x), y) / K).backward()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "i % K"))]
    assert acl307.fixed(source, unsafe=True) == textwrap.dedent(source)


def test_trainer_loop_calling_a_training_step_method(acl307, at):
    source = """
    class Trainer:
        def training_step(self, batch):
            loss = self.model(batch).loss / self.args.gradient_accumulation_steps
            loss.backward()

        def train(self):
            for step, batch in enumerate(self.train_dataloader):
                self.training_step(batch)
                if (step + 1) % self.args.gradient_accumulation_steps == 0:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
    """
    assert acl307.findings(source) == [("ACL307", *at(source, "(step + 1) %"))]
    fixed = acl307.fixed(source, unsafe=True)
    assert "== 0 or step + 1 == len(self.train_dataloader):" in fixed
