"""ACL312 off-by-one-step-gate: a modulo step gate that fires one micro-batch early."""

from __future__ import annotations

import textwrap

ZERO_BASED = """
for step, batch in enumerate(dl):
    accelerator.backward(model(**batch).loss / N)
    if step % N == 0 or step + 1 == len(dl):
        opt.step()
        opt.zero_grad()
"""


def test_zero_based_enumerate_with_step_mod_k(acl312, at):
    assert acl312.findings(ZERO_BASED) == [("ACL312", *at(ZERO_BASED, "step % N"))]
    assert acl312.fixed(ZERO_BASED) == textwrap.dedent(ZERO_BASED)  # unsafe only
    assert acl312.fixed(ZERO_BASED, unsafe=True) == textwrap.dedent(ZERO_BASED).replace(
        "if step % N", "if (step + 1) % N"
    )


def test_one_based_enumerate_with_plus_one(acl312, at):
    source = """
    for i, (x, y) in enumerate(loader, 1):
        (crit(model(x), y) / args.accum_steps).backward()
        if (i + 1) % args.accum_steps == 0 or i == len(loader):
            optimizer.step()
            optimizer.zero_grad()
    """
    assert acl312.findings(source) == [("ACL312", *at(source, "(i + 1) % args"))]
    assert "if i % args.accum_steps == 0 or i == len(loader):" in acl312.fixed(source, unsafe=True)


def test_counter_incremented_after_the_gate(acl312, at):
    source = """
    micro = 0
    while True:
        (model(next(batches)).loss / cfg["accum"]).backward()
        if micro % cfg["accum"] == 0:
            opt.step()
            opt.zero_grad()
        micro += 1
    """
    assert acl312.findings(source) == [("ACL312", *at(source, "micro % cfg"))]
    assert 'if (micro + 1) % cfg["accum"] == 0:' in acl312.fixed(source, unsafe=True)


def test_counter_incremented_before_the_gate_with_plus_one(acl312, at):
    source = """
    class Trainer:
        def fit(self):
            self.micro = 0
            for batch in self.loader:
                (self.model(batch).loss / self.grad_accum).backward()
                self.micro += 1
                if (self.micro + 1) % self.grad_accum == 0:
                    self.opt.step()
                    self.opt.zero_grad()
    """
    assert acl312.findings(source) == [("ACL312", *at(source, "(self.micro + 1) %"))]
    fixed = acl312.fixed(source, unsafe=True)
    assert "if self.micro % self.grad_accum == 0:" in fixed


def test_gate_bound_to_a_name_in_a_helper(acl312, at):
    source = """
    GRAD_ACCUM = 8

    def train_one_epoch(model, loader, optimizer):
        for it, (x, y) in enumerate(loader):
            do_step = it % GRAD_ACCUM == 0 or it + 1 == len(loader)
            (crit(model(x), y) / GRAD_ACCUM).backward()
            if do_step:
                optimizer.step()
                optimizer.zero_grad()
    """
    assert acl312.findings(source) == [("ACL312", *at(source, "it % GRAD"))]
    assert "do_step = (it + 1) % GRAD_ACCUM == 0 or" in acl312.fixed(source, unsafe=True)


def test_literal_k(acl312, at):
    source = """
    for i, (x, y) in enumerate(dl):
        (crit(model(x), y) / 4).backward()
        if i % 4 == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
    """
    assert acl312.findings(source) == [("ACL312", *at(source, "i % 4"))]


def test_plus_one_with_a_zero_based_index(acl312):
    assert acl312.findings(ZERO_BASED.replace("step % N", "(step + 1) % N")) == []


def test_mod_k_with_a_one_based_index(acl312):
    source = ZERO_BASED.replace("enumerate(dl)", "enumerate(dl, start=1)")
    assert acl312.findings(source.replace("step + 1 == len", "step == len")) == []


def test_counter_incremented_before_the_gate(acl312):
    source = """
    micro_step = 0
    for batch in loader:
        (model(batch).loss / accum).backward()
        micro_step += 1
        if micro_step % accum == 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl312.findings(source) == []


def test_last_remainder_with_a_zero_based_index(acl312):
    assert acl312.findings(ZERO_BASED.replace("step % N == 0", "step % N == N - 1")) == []


def test_optimizer_step_counter_for_a_logging_cadence(acl312):
    source = """
    global_step = 0
    for i, batch in enumerate(dl):
        (model(batch).loss / K).backward()
        if (i + 1) % K == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
            global_step += 1
            if global_step % log_every == 0:
                log(global_step)
    """
    assert acl312.findings(source) == []


def test_step_gate_on_an_optimizer_step_counter(acl312):
    """A counter advanced on the update step counts optimizer steps, not micro-batches."""
    source = """
    updates = 0
    for batch in dl:
        (model(batch).loss / K).backward()
        if updates % K == 0:
            opt.step()
            opt.zero_grad()
            updates += 1
    """
    assert acl312.findings(source) == []


def test_gate_before_the_backward_steps_the_previous_window(acl312):
    source = """
    for i, batch in enumerate(dl):
        if i % K == 0 and i > 0:
            opt.step()
            opt.zero_grad()
        (model(batch).loss / K).backward()
    """
    assert acl312.findings(source) == []


def test_nanogpt_micro_step_loop(acl312):
    source = """
    for it in range(max_iters):
        for micro_step in range(grad_accum):
            (model(*get_batch()) / grad_accum).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """
    assert acl312.findings(source) == []


def test_first_step_skipped_by_a_conjunct_is_still_late(acl312, at):
    source = """
    for step, batch in enumerate(dl):
        (model(batch).loss / K).backward()
        if step % K == 0 and step > 0:
            opt.step()
            opt.zero_grad()
    """
    assert acl312.findings(source) == [("ACL312", *at(source, "step % K"))]
    assert "if (step + 1) % K == 0 and step > 0:" in acl312.fixed(source, unsafe=True)
    (message,) = [d.message for d in acl312.diagnostics(source)]
    assert "on micro-batches 1, K + 1, 2 * K + 1, ... instead of K, 2 * K, ..." in message


def test_gate_in_the_loop_that_calls_a_per_batch_function(acl312, at):
    source = """
    def train_step(batch):
        (model(batch).loss / K).backward()

    for i, batch in enumerate(dl):
        train_step(batch)
        if i % K == 0 or i + 1 == len(dl):
            opt.step()
            opt.zero_grad()
    """
    assert acl312.findings(source) == [("ACL312", *at(source, "i % K"))]
    assert "if (i + 1) % K == 0 or i + 1 == len(dl):" in acl312.fixed(source, unsafe=True)
